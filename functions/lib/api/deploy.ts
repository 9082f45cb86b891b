/**
 * `spec.deploy[]` of an App.
 *
 * Mirrors `pkg/apis/kappctrl/v1alpha1/types_deploy.go`. Exactly one entry, and it must be `kapp`
 * (checked at reconcile time: `Expected exactly one deploy option`). `rawOptions` are checked
 * against upstream's allow-lists by the deploy step (`pkg/deploy/kapp_restrict.go`), not here.
 *
 * @module
 */
import * as z from 'zod';

/** `kapp inspect` configuration (`AppDeployKappInspect`). */
export const AppDeployKappInspectSchema = z.object({
  rawOptions: z.array(z.string()).describe('Pass through options to kapp inspect (optional)').optional(),
});

/** kapp inspect options; presence (even `{}`) enables inspect. */
export type AppDeployKappInspect = z.infer<typeof AppDeployKappInspectSchema>;

/** `kapp delete` configuration (`AppDeployKappDelete`). */
export const AppDeployKappDeleteSchema = z.object({
  rawOptions: z.array(z.string()).describe('Pass through options to kapp delete (optional)').optional(),
});

/** kapp delete options. */
export type AppDeployKappDelete = z.infer<typeof AppDeployKappDeleteSchema>;

/** `kapp deploy` configuration (`AppDeployKapp`). */
export const AppDeployKappSchema = z.object({
  intoNs: z.string().describe('Override namespace for all resources (optional); kapp --into-ns').optional(),
  mapNs: z
    .array(z.string())
    .describe('Provide custom namespace override mapping (optional); one kapp --map-ns each')
    .optional(),
  rawOptions: z
    .array(z.string())
    .describe('Pass through options to kapp deploy (optional); each in --name=value form and allow-listed')
    .optional(),
  inspect: AppDeployKappInspectSchema.describe(
    'Configuration for inspect command (optional) as of kapp-controller v0.31.0, inspect is disabled by default add rawOptions or use an empty inspect config like `inspect: {}` to enable',
  ).optional(),
  delete: AppDeployKappDeleteSchema.describe('Configuration for delete command (optional)').optional(),
});

/** kapp deploy step. */
export type AppDeployKapp = z.infer<typeof AppDeployKappSchema>;

/** One `spec.deploy[]` entry (`AppDeploy`). */
export const AppDeploySchema = z.object({
  kapp: AppDeployKappSchema.describe('Use kapp to deploy resources').optional(),
});

/** One deploy step of an App. */
export type AppDeploy = z.infer<typeof AppDeploySchema>;
