/**
 * One in-memory Lease with optimistic concurrency, for tests of the election
 * (`events/forwarder/leader.ts`) through its {@link LeaseView} port.
 */
import { ConflictError, type Lease, type LeaseSpec, type LeaseView } from '../../../functions/lib/kube/port.js';

/** One Lease with optimistic concurrency; `put` is another runtime writing it. */
export class OneLease {
  /** The Lease as stored, `undefined` before anyone created it. */
  lease: Lease | undefined;
  private rv = 1;
  /** The port the elector reads and writes through: a stale resourceVersion is a 409. */
  readonly view: LeaseView = {
    getLease: async () => structuredClone(this.lease),
    createLease: async (_ns, _name, spec) => {
      if (this.lease) throw new ConflictError('409 already exists');
      return this.put(spec);
    },
    updateLease: async (_ns, _name, rv, spec) => {
      if (this.lease?.metadata.resourceVersion !== rv) throw new ConflictError('409 conflict');
      return this.put(spec);
    },
  };
  /** Writes `spec` with a new resourceVersion (as another runtime taking or renewing the Lease). */
  put(spec: LeaseSpec): Lease {
    this.lease = {
      metadata: { name: 'l', namespace: 'kapp-lambda', uid: 'u', resourceVersion: String(++this.rv) },
      spec: structuredClone(spec),
    };
    return structuredClone(this.lease);
  }
}
