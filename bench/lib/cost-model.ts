/**
 * The fleet cost model of issue 13 item 8, pure arithmetic: what a month of a fleet costs on
 * Lambda + SQS + S3 (+ KMS) from what one reconcile, one idle resync, … costs in invocations,
 * function time, object-store and queue requests, next to the same fleet on kapp-controller,
 * its pods' resource requests priced as a share of a node. No I/O: the `cost` scenario
 * (`bench/scenarios/cost.ts`) feeds it measured figures and prints it; bench/README.md, "Fleet
 * cost model", states every price with its source and date and every assumption.
 *
 * @module
 */

/** A unit price and where it comes from. */
export interface Price {
  /** US dollars per one `unit`. */
  usd: number;
  unit: string;
  /** Where the figure was read, and as of when. */
  source: string;
}

/** Lambda's duration tiers: GB-seconds per month up to which `factor` × the base price applies. */
export interface DurationTier {
  /** Upper bound of the tier, GB-seconds per month (`Infinity` for the last). */
  upToGbSeconds: number;
  /** Multiplier of the base GB-second price in this tier (1, 0.9, 0.8). */
  factor: number;
}

/** Prices of one region and Lambda architecture. */
export interface Prices {
  region: string;
  architecture: 'x86_64' | 'arm64';
  lambdaRequest: Price;
  /** Base (first-tier) price of one GB-second of duration. */
  lambdaGbSecond: Price;
  lambdaTiers: readonly DurationTier[];
  /** Per GB-second of ephemeral storage configured above the free 512 MB. */
  lambdaEphemeralGbSecond: Price;
  /** One FIFO request (send, receive, delete; each 64 KB chunk of payload). */
  sqsFifoRequest: Price;
  /** One PUT, COPY, POST or LIST request (S3 Standard). */
  s3Put: Price;
  /** One GET, HEAD or other request (S3 Standard). */
  s3Get: Price;
  s3StorageGbMonth: Price;
  kmsKeyMonth: Price;
  kmsRequest: Price;
}

/** A node that kapp-controller's pod is priced as a share of. */
export interface NodePrice {
  instance: string;
  /** On-demand price, US dollars per hour. */
  usdPerHour: number;
  vcpu: number;
  memoryGiB: number;
  source: string;
}

/** Memory and `/tmp` of one function (`STAGE_SIZING` of infra/aws/stages.ts). */
export interface FunctionSize {
  memoryMiB: number;
  ephemeralMiB: number;
}

/** One function invocation of a workload. */
export interface Invocation {
  /** The function (a key of the sizing table). */
  fn: string;
  /** Billed duration, ms (Lambda rounds each invocation up to a whole ms). */
  ms: number;
}

/** Something the fleet does repeatedly, and what one occurrence costs in resources. */
export interface Workload {
  name: string;
  /** Occurrences per month, whole fleet. */
  perMonth: number;
  invocations: readonly Invocation[];
  /** Object-store requests of one occurrence, GET/HEAD class and PUT/LIST class. */
  storeGets: number;
  storePuts: number;
  /** Queue messages of one occurrence (each is sent, received and deleted: `SQS_REQUESTS_PER_MESSAGE`). */
  messages: number;
  /** Where the figures come from (measured in which file, or the assumption). */
  source: string;
}

/** Requests per SQS message of an event source mapping with batch size 1: SendMessage, ReceiveMessage, DeleteMessage. */
export const SQS_REQUESTS_PER_MESSAGE = 3;

/** One billed line of the month. */
export interface CostLine {
  item: string;
  quantity: number;
  unit: string;
  usd: number;
}

/** The month of the fleet on Lambda. */
export interface LambdaFleetCost {
  lines: CostLine[];
  /** US dollars per month by workload (its share of the usage lines; fixed lines not included). */
  byWorkload: { name: string; perMonth: number; usdPerOccurrence: number; usd: number }[];
  total: number;
  /** The largest line and the largest workload, with their share of the total. */
  dominant: { line: string; lineShare: number; workload: string; workloadShare: number };
}

/** Things billed by the month rather than per use. */
export interface FixedUse {
  /** Data kept in the bucket, GB. */
  storedGb: number;
  kmsKeys: number;
  kmsRequestsPerMonth: number;
}

/** Lambda duration cost of `gbSeconds` in a month, with the tiers applied. */
export function tieredDurationUsd(gbSeconds: number, base: number, tiers: readonly DurationTier[]): number {
  let usd = 0;
  let from = 0;
  for (const t of tiers) {
    const inTier = Math.max(0, Math.min(gbSeconds, t.upToGbSeconds) - from);
    usd += inTier * base * t.factor;
    from = t.upToGbSeconds;
    if (gbSeconds <= from) break;
  }
  return usd;
}

interface Use {
  requests: number;
  gbSeconds: number;
  ephemeralGbSeconds: number;
  sqs: number;
  puts: number;
  gets: number;
}

/** Resources of one occurrence of `w`. @throws Error for a function missing from `sizing`. */
function useOf(w: Workload, sizing: Readonly<Record<string, FunctionSize>>): Use {
  let gbSeconds = 0;
  let ephemeralGbSeconds = 0;
  for (const inv of w.invocations) {
    const size = sizing[inv.fn];
    if (!size) throw new Error(`cost model: no sizing for function ${inv.fn}`);
    const s = Math.ceil(inv.ms) / 1000;
    gbSeconds += (size.memoryMiB / 1024) * s;
    ephemeralGbSeconds += (Math.max(0, size.ephemeralMiB - 512) / 1024) * s;
  }
  return {
    requests: w.invocations.length,
    gbSeconds,
    ephemeralGbSeconds,
    sqs: w.messages * SQS_REQUESTS_PER_MESSAGE,
    puts: w.storePuts,
    gets: w.storeGets,
  };
}

/**
 * The month of `workloads` on Lambda + SQS + S3 + KMS. Free tiers are left out (1 M Lambda and
 * SQS requests, 400,000 GB-s: well under 1 % of a fleet's month). Duration tiers apply to the
 * month's total GB-seconds; a workload's share of the duration line is pro rata.
 * @throws Error for an invocation of a function missing from `sizing`.
 */
export function lambdaFleetCost(
  workloads: readonly Workload[],
  sizing: Readonly<Record<string, FunctionSize>>,
  prices: Prices,
  fixed: FixedUse,
): LambdaFleetCost {
  const uses = workloads.map((w) => ({ w, u: useOf(w, sizing) }));
  const sum = (f: (u: Use) => number) => uses.reduce((a, { w, u }) => a + f(u) * w.perMonth, 0);
  const requests = sum((u) => u.requests);
  const gbSeconds = sum((u) => u.gbSeconds);
  const ephemeral = sum((u) => u.ephemeralGbSeconds);
  const sqs = sum((u) => u.sqs);
  const puts = sum((u) => u.puts);
  const gets = sum((u) => u.gets);
  const durationUsd = tieredDurationUsd(gbSeconds, prices.lambdaGbSecond.usd, prices.lambdaTiers);
  // the tiers' average discount, applied to each workload's duration alike
  const durationFactor = gbSeconds > 0 ? durationUsd / (gbSeconds * prices.lambdaGbSecond.usd) : 1;
  const lines: CostLine[] = [
    { item: 'Lambda requests', quantity: requests, unit: 'requests', usd: requests * prices.lambdaRequest.usd },
    { item: `Lambda duration (${prices.architecture})`, quantity: gbSeconds, unit: 'GB-s', usd: durationUsd },
    {
      item: 'Lambda ephemeral storage above 512 MB',
      quantity: ephemeral,
      unit: 'GB-s',
      usd: ephemeral * prices.lambdaEphemeralGbSecond.usd,
    },
    { item: 'SQS FIFO requests', quantity: sqs, unit: 'requests', usd: sqs * prices.sqsFifoRequest.usd },
    { item: 'S3 PUT/LIST requests', quantity: puts, unit: 'requests', usd: puts * prices.s3Put.usd },
    { item: 'S3 GET/HEAD requests', quantity: gets, unit: 'requests', usd: gets * prices.s3Get.usd },
    {
      item: 'S3 storage',
      quantity: fixed.storedGb,
      unit: 'GB-month',
      usd: fixed.storedGb * prices.s3StorageGbMonth.usd,
    },
    {
      item: 'KMS keys and requests',
      quantity: fixed.kmsKeys,
      unit: 'keys',
      usd: fixed.kmsKeys * prices.kmsKeyMonth.usd + fixed.kmsRequestsPerMonth * prices.kmsRequest.usd,
    },
  ];
  const byWorkload = uses.map(({ w, u }) => {
    const one =
      u.requests * prices.lambdaRequest.usd +
      u.gbSeconds * prices.lambdaGbSecond.usd * durationFactor +
      u.ephemeralGbSeconds * prices.lambdaEphemeralGbSecond.usd +
      u.sqs * prices.sqsFifoRequest.usd +
      u.puts * prices.s3Put.usd +
      u.gets * prices.s3Get.usd;
    return { name: w.name, perMonth: w.perMonth, usdPerOccurrence: one, usd: one * w.perMonth };
  });
  const total = lines.reduce((a, l) => a + l.usd, 0);
  const topLine = lines.reduce((a, b) => (b.usd > a.usd ? b : a));
  const topWorkload = byWorkload.reduce((a, b) => (b.usd > a.usd ? b : a), byWorkload[0] ?? { name: '', usd: 0 });
  return {
    lines,
    byWorkload,
    total,
    dominant: {
      line: topLine.item,
      lineShare: total > 0 ? topLine.usd / total : 0,
      workload: topWorkload.name,
      workloadShare: total > 0 ? topWorkload.usd / total : 0,
    },
  };
}

/** kapp-controller's pod: the sum of its containers' resource requests. */
export interface PodRequests {
  vcpu: number;
  memoryGiB: number;
  source: string;
}

/** The month of the fleet on kapp-controller. */
export interface KappControllerFleetCost {
  /** Share of one node one cluster's pod takes: the larger of its CPU and memory shares. */
  nodeShare: number;
  /** Which of the two decides the share. */
  boundBy: 'cpu' | 'memory';
  perClusterUsd: number;
  total: number;
}

/**
 * kapp-controller's month: each cluster runs one pod whose requests reserve
 * `max(vCPU requested / node vCPUs, GiB requested / node GiB)` of a node for the whole month
 * (what the scheduler sets aside, used or not), priced at the node's on-demand rate.
 */
export function kappControllerFleetCost(
  clusters: number,
  pod: PodRequests,
  node: NodePrice,
  monthHours: number,
): KappControllerFleetCost {
  const cpuShare = pod.vcpu / node.vcpu;
  const memShare = pod.memoryGiB / node.memoryGiB;
  const nodeShare = Math.max(cpuShare, memShare);
  const perClusterUsd = nodeShare * node.usdPerHour * monthHours;
  return {
    nodeShare,
    boundBy: cpuShare >= memShare ? 'cpu' : 'memory',
    perClusterUsd,
    total: perClusterUsd * clusters,
  };
}
