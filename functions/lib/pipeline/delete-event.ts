/**
 * `dev.kapp-lambda.stage.delete.v1`: the fetch function's reconcile step → the deploy
 * function, for an App whose deletion started and that carries our finalizer (only the
 * deploy function holds the credentials `kapp delete` needs). Same envelope rules as the
 * events in `events/schema.ts`: a reference (`object`) plus the run it belongs to.
 */
import { createHash } from 'node:crypto';
import { z } from 'zod';
import { ObjectRefSchema, StageRunSchema, subjectOf } from '../../../events/schema.js';

/** CloudEvents `type` of a delete hand-off. */
export const DELETE_EVENT_TYPE = 'dev.kapp-lambda.stage.delete.v1';

/** `data` of a delete hand-off: `{ object, run }`; `object.kind` is `App`. */
export const DeleteStageDataSchema = z.strictObject({ object: ObjectRefSchema, run: StageRunSchema });
/** See {@link DeleteStageDataSchema}. */
export type DeleteStageData = z.infer<typeof DeleteStageDataSchema>;

/** The whole event. */
export const DeleteStageEventSchema = z.object({
  specversion: z.literal('1.0'),
  id: z.string().min(1).max(128),
  source: z.string().min(1),
  type: z.literal(DELETE_EVENT_TYPE),
  time: z.string().min(1),
  datacontenttype: z.literal('application/json'),
  subject: z.string().min(1),
  data: DeleteStageDataSchema,
});
/** See {@link DeleteStageEventSchema}. */
export type DeleteStageEvent = z.infer<typeof DeleteStageEventSchema>;

/** Builds a delete hand-off; the id is derived from the content, so retries emit the same id. */
export function deleteEvent(data: DeleteStageData, opts: { time: Date | string }): DeleteStageEvent {
  const time = typeof opts.time === 'string' ? opts.time : opts.time.toISOString();
  const subject = subjectOf(data.object);
  const id = createHash('sha256')
    .update(JSON.stringify([DELETE_EVENT_TYPE, subject, time, data.run.runId]))
    .digest('hex')
    .slice(0, 32);
  return DeleteStageEventSchema.parse({
    specversion: '1.0',
    id,
    source: '/kapp-lambda/functions/fetch',
    type: DELETE_EVENT_TYPE,
    time,
    datacontenttype: 'application/json',
    subject,
    data,
  });
}

/** Narrows any event to a delete hand-off. */
export function isDeleteEvent(e: { type: string }): e is DeleteStageEvent {
  return e.type === DELETE_EVENT_TYPE;
}
