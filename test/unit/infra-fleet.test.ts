import { describe, expect, it } from 'vitest';
import { PIPELINE_STAGES } from '../../functions/lib/api/functions.js';
import { DEFAULT_DEADLINE_MARGIN_MS } from '../../functions/lib/entry/handler.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { FleetContextError, fleetSettings } from '../../infra/aws/fleet.js';
import {
  FORWARDER_STAGES,
  registryPrefixProblem,
  STAGE_SIZING,
  TOOL_TIMEOUT_MARGIN_MS,
  toolTimeoutMs,
} from '../../infra/aws/stages.js';

const settings = (context: Record<string, unknown>) => fleetSettings((k) => context[k]);
/** The problems `settings(context)` names; none when it succeeds. */
const problems = (context: Record<string, unknown>): string[] => {
  try {
    settings(context);
    return [];
  } catch (err) {
    return [...(err as FleetContextError).problems];
  }
};

describe('fleetSettings', () => {
  it('fills the documented defaults from an empty context', () => {
    expect(settings({})).toEqual({
      clusterRegistryPrefix: 'registry/',
      sourcePollMinutes: 1,
      maxDeployWaitMinutes: 60,
      concurrency: { fetch: 10, template: 10, deploy: 10, 'index-repo': 5, install: 5 },
      // Half each function's slots (concurrency × records at once) per cluster, half that per namespace.
      clusterShare: { fetch: 5, template: 5, deploy: 5, 'index-repo': 2, install: 25 },
      namespaceShare: { fetch: 3, template: 3, deploy: 3, 'index-repo': 1, install: 13 },
      logRetentionDays: 30,
      artifactRetentionDays: 30,
      forwarders: {},
      urlAllow: [],
      isolation: 'shared',
      sharing: 'cluster',
      unkeyedGroups: 'refuse',
      logEncryption: true,
      reservedConcurrency: {},
    });
  });

  it('parses command-line strings: lists, numbers, JSON', () => {
    const s = settings({
      clusterRegistryBucket: 'fleet-admin-registry',
      clusterRegistryPrefix: 'kapp-lambda/prod',
      sourcePollMinutes: '5',
      maxDeployWaitMinutes: '20',
      concurrency: '{"deploy": 40}',
      clusterShare: '{"fetch": 8}',
      namespaceShare: '2',
      logRetentionDays: '90',
      artifactRetentionDays: '7',
      alarmTopicArn: 'arn:aws:sns:eu-west-1:123456789012:kapp-lambda-alarms',
      forwarders: '{"prod-eu-1": {"eksClusterArn": "arn:aws:eks:eu-west-1:123456789012:cluster/prod"}}',
      urlAllow: '["registry.corp:443", "10.20.0.0/16"]',
      kmsKeyArn: 'arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab',
      logEncryption: 'false',
      reservedConcurrency: '{"deploy": 50}',
      vpcId: 'vpc-0a1b2c3d4e5f60718',
      subnetIds: 'subnet-0a1b2c3d, subnet-0e1f2a3b',
    });
    expect(s).toEqual({
      clusterRegistryBucket: 'fleet-admin-registry',
      clusterRegistryPrefix: 'kapp-lambda/prod/',
      sourcePollMinutes: 5,
      maxDeployWaitMinutes: 20,
      concurrency: { fetch: 10, template: 10, deploy: 40, 'index-repo': 5, install: 5 },
      clusterShare: { fetch: 8, template: 5, deploy: 20, 'index-repo': 2, install: 25 },
      namespaceShare: { fetch: 2, template: 2, deploy: 2, 'index-repo': 2, install: 2 },
      logRetentionDays: 90,
      artifactRetentionDays: 7,
      alarmTopicArn: 'arn:aws:sns:eu-west-1:123456789012:kapp-lambda-alarms',
      forwarders: { 'prod-eu-1': { eksClusterArn: 'arn:aws:eks:eu-west-1:123456789012:cluster/prod' } },
      urlAllow: ['registry.corp:443', '10.20.0.0/16'],
      isolation: 'shared',
      sharing: 'cluster',
      unkeyedGroups: 'refuse',
      kmsKeyArn: 'arn:aws:kms:eu-west-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab',
      logEncryption: false,
      reservedConcurrency: { deploy: 50 },
      vpc: { vpcId: 'vpc-0a1b2c3d4e5f60718', subnetIds: ['subnet-0a1b2c3d', 'subnet-0e1f2a3b'], securityGroupIds: [] },
    });
  });

  it('refuses a VPC without subnets, subnets without a VPC, a key alias, and a reservation below the concurrency', () => {
    const problems = (context: Record<string, unknown>) => {
      try {
        settings(context);
        return [];
      } catch (err) {
        expect(err).toBeInstanceOf(FleetContextError);
        return (err as FleetContextError).problems;
      }
    };
    expect(problems({ vpcId: 'vpc-0a1b2c3d' })).toEqual([expect.stringMatching(/^subnetIds: vpcId needs/)]);
    expect(problems({ subnetIds: '["subnet-0a1b2c3d"]' })).toEqual([expect.stringMatching(/^vpcId: /)]);
    expect(problems({ vpcId: 'vpc-0a1b2c3d', subnetIds: 'subnet-x' })).toEqual(['subnetIds.0: expected subnet ids']);
    expect(problems({ kmsKeyArn: 'arn:aws:kms:eu-west-1:123456789012:alias/mine' })).toEqual([
      expect.stringMatching(/^kmsKeyArn: expected a KMS key ARN/),
    ]);
    expect(problems({ reservedConcurrency: 4 })).toEqual([
      "reservedConcurrency: fetch: 4 is below its concurrency 10 (the queue's pollers would be throttled)",
      "reservedConcurrency: template: 4 is below its concurrency 10 (the queue's pollers would be throttled)",
      "reservedConcurrency: deploy: 4 is below its concurrency 10 (the queue's pollers would be throttled)",
      "reservedConcurrency: index-repo: 4 is below its concurrency 5 (the queue's pollers would be throttled)",
      "reservedConcurrency: install: 4 is below its concurrency 5 (the queue's pollers would be throttled)",
    ]);
    expect(settings({ reservedConcurrency: '{"install": 5}' }).reservedConcurrency).toEqual({ install: 5 });
    expect(problems({ logEncryption: 'maybe' })).toEqual(['logEncryption: expected true or false']);
    expect(problems({ clusterShare: 2, namespaceShare: '{"install": 3}' })).toEqual([
      'namespaceShare: install: 3 is above its clusterShare 2',
    ]);
    expect(problems({ clusterShare: 0 })).toEqual([
      'clusterShare: expected an integer from 1 to 10000, or a JSON object of function → integer',
    ]);
  });

  it('takes urlAllow as a cdk.json array or a comma list, each entry as the functions parse KAPP_LAMBDA_URL_ALLOW', () => {
    expect(settings({ urlAllow: ['git.corp', 'fd00::/8', '[fd00::1]:5000'] }).urlAllow).toEqual([
      'git.corp',
      'fd00::/8',
      '[fd00::1]:5000',
    ]);
    expect(settings({ urlAllow: ' registry.corp:443 , 10.20.0.0/16 ' }).urlAllow).toEqual([
      'registry.corp:443',
      '10.20.0.0/16',
    ]);
    expect(settings({ urlAllow: '[]' }).urlAllow).toEqual([]);
  });

  it('fails the synth on a malformed urlAllow entry, naming it', () => {
    const problems = (urlAllow: unknown) => {
      try {
        settings({ urlAllow });
        return [];
      } catch (err) {
        expect(err).toBeInstanceOf(FleetContextError);
        return [...(err as FleetContextError).problems];
      }
    };
    const invalid = (i: number, entry: string) =>
      `urlAllow.${i}: invalid entry ${JSON.stringify(entry)}: expected a host, host:port or CIDR (e.g. registry.corp:443, 10.20.0.0/16)`;
    expect(problems(['https://registry.corp/v2', '10.20.0.0/16', '10.0.0.0/99', 'a,b', ''])).toEqual([
      invalid(0, 'https://registry.corp/v2'),
      invalid(2, '10.0.0.0/99'),
      invalid(3, 'a,b'),
      invalid(4, ''),
    ]);
    expect(problems('registry.corp, *.corp')).toEqual([invalid(1, '*.corp')]);
    expect(problems('{"registry.corp": true}')).toEqual([
      'urlAllow: expected a JSON array of host, host:port or CIDR entries',
    ]);
  });

  it('applies one concurrency number to every function, as cdk.json values arrive', () => {
    expect(Object.values(settings({ concurrency: 25 }).concurrency)).toEqual(PIPELINE_STAGES.map(() => 25));
    expect(settings({ concurrency: '3' }).concurrency.install).toBe(3);
  });

  it('names every invalid key', () => {
    const bad = {
      clusterRegistryBucket: 'Fleet_Registry',
      clusterRegistryPrefix: 'a//b',
      sourcePollMinutes: '0',
      maxDeployWaitMinutes: '2000',
      concurrency: '1',
      logRetentionDays: '31',
      alarmTopicArn: 'arn:aws:sqs:eu-west-1:123456789012:q',
      forwarders:
        '{"Prod": {"eksClusterArn": "arn:aws:eks:eu-west-1:123456789012:cluster/prod"}, "edge": {"eksClusterArn": "prod"}}',
    };
    expect(() => settings(bad)).toThrow(FleetContextError);
    try {
      settings(bad);
    } catch (err) {
      expect((err as FleetContextError).problems).toEqual([
        'clusterRegistryBucket: expected an S3 bucket name',
        'clusterRegistryPrefix: expected a key prefix of [A-Za-z0-9._-] segments',
        'sourcePollMinutes: Too small: expected number to be >=1',
        'maxDeployWaitMinutes: expected at most 1440 (a day)',
        'concurrency: expected an integer from 2 to 1000, or a JSON object of function → integer',
        `logRetentionDays: expected one of 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653`,
        'alarmTopicArn: expected an sns ARN',
        'forwarders.Prod: expected a JSON object of cluster id → {"eksClusterArn": …}',
        'forwarders.edge.eksClusterArn: expected an EKS cluster ARN',
      ]);
    }
  });

  it('takes isolation shared or cell; cell needs the clusters in forwarders', () => {
    const forwarders = '{"a": {"eksClusterArn": "arn:aws:eks:eu-west-1:123456789012:cluster/a"}}';
    expect(settings({ isolation: 'cell', forwarders }).isolation).toBe('cell');
    expect(settings({ isolation: ' shared ' }).isolation).toBe('shared');
    expect(problems({ isolation: 'tenant', forwarders })).toEqual(['isolation: expected one of shared, cell']);
    expect(problems({ isolation: 'cell' })).toEqual([
      `isolation: cell makes one cell per cluster id of forwarders, which names none (e.g. -c 'forwarders={"prod-eu-1":{"eksClusterArn":"arn:aws:eks:…:cluster/prod-eu-1"}}')`,
    ]);
  });

  it("takes unkeyedGroups refuse (the default) or accept, an upgrade's window", () => {
    expect(settings({}).unkeyedGroups).toBe('refuse');
    expect(settings({ unkeyedGroups: 'accept' }).unkeyedGroups).toBe('accept');
    expect(problems({ unkeyedGroups: 'yes' })).toEqual(['unkeyedGroups: expected refuse or accept']);
  });

  it('takes sharing cluster (the default of isolation shared) or fleet; a cell shares with the fleet only', () => {
    const forwarders = '{"a": {"eksClusterArn": "arn:aws:eks:eu-west-1:123456789012:cluster/a"}}';
    expect(settings({ sharing: 'fleet' }).sharing).toBe('fleet');
    expect(settings({ sharing: ' cluster ' }).sharing).toBe('cluster');
    expect(settings({ isolation: 'cell', forwarders }).sharing).toBe('fleet');
    expect(settings({ isolation: 'cell', forwarders, sharing: 'fleet' }).sharing).toBe('fleet');
    expect(problems({ sharing: 'group' })).toEqual(['sharing: expected one of fleet, cluster']);
    expect(problems({ isolation: 'cell', forwarders, sharing: 'cluster' })).toEqual([
      "sharing: cluster needs isolation: shared (a cell's functions run without the dispatcher's per-cluster sessions that fence a domain)",
    ]);
  });

  it('refuses a per-function concurrency for a function that does not exist', () => {
    expect(() => settings({ concurrency: '{"render": 5}' })).toThrow(/concurrency/);
  });
});

describe('cluster registry prefix', () => {
  it('keeps the registry in the artifact bucket clear of expiring and function-writable keys', () => {
    expect(registryPrefixProblem('registry/')).toBeUndefined();
    expect(registryPrefixProblem('')).toBeUndefined();
    expect(registryPrefixProblem('state/')).toBeUndefined();
    expect(registryPrefixProblem('cache/')).toBe('the registry must not be under cache/, which expires');
    expect(registryPrefixProblem('private/x/')).toBe('the registry must not be under private/, which expires');
    expect(registryPrefixProblem('state/package-repositories/')).toBe(
      'the index-repo function may write state/package-repositories/*, which would hold the registry',
    );
    expect(() => settings({ clusterRegistryPrefix: 'artifacts/fleet' })).toThrow(
      'invalid CDK context: clusterRegistryPrefix: the registry must not be under artifacts/, which expires',
    );
    // In a bucket of its own, no prefix of the artifact bucket matters.
    expect(
      settings({ clusterRegistryBucket: 'fleet-registry', clusterRegistryPrefix: 'cache' }).clusterRegistryPrefix,
    ).toBe('cache/');
  });
});

describe('stage sizing', () => {
  it('keeps every tool timeout inside its function timeout, and none for a function without tools', () => {
    for (const stage of PIPELINE_STAGES) {
      const t = toolTimeoutMs(stage);
      const limit = STAGE_SIZING[stage].timeoutSeconds * 1000;
      if (STAGE_TOOLS[stage].length === 0) expect(t).toBeUndefined();
      // Deploy's comes after the function deadline (30 s before the limit), which continues kapp's wait.
      else if (stage === 'deploy') expect(t).toBe(limit - DEFAULT_DEADLINE_MARGIN_MS / 2);
      else expect(t).toBe(limit - TOOL_TIMEOUT_MARGIN_MS);
    }
    expect(TOOL_TIMEOUT_MARGIN_MS).toBe(60_000);
  });

  it('stays within what Lambda and a FIFO event source mapping accept', () => {
    for (const s of Object.values(STAGE_SIZING)) {
      expect(s.timeoutSeconds).toBeLessThanOrEqual(900);
      expect(s.memoryMiB).toBeGreaterThanOrEqual(128);
      expect(s.memoryMiB).toBeLessThanOrEqual(10_240);
      expect(s.ephemeralMiB).toBeGreaterThanOrEqual(512);
      expect(s.ephemeralMiB).toBeLessThanOrEqual(10_240);
      expect(s.batchSize).toBeGreaterThanOrEqual(1);
      expect(s.batchSize).toBeLessThanOrEqual(10);
      // More at once than a batch holds would never be used.
      expect(s.recordConcurrency).toBeGreaterThanOrEqual(1);
      expect(s.recordConcurrency).toBeLessThanOrEqual(s.batchSize);
      expect(s.concurrency).toBeGreaterThanOrEqual(2);
    }
  });

  it('routes the forwarders to the entry function of each kind', () => {
    expect(FORWARDER_STAGES).toEqual(['fetch', 'install', 'index-repo']);
  });
});
