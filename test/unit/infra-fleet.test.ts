import { describe, expect, it } from 'vitest';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { PIPELINE_STAGES } from '../../functions/lib/transport/port.js';
import {
  DEFAULT_KUBECONFIG_PATH,
  FleetContextError,
  fleetSettings,
  kubeconfigClusterAccess,
} from '../../infra/aws/fleet.js';
import { FORWARDER_STAGES, STAGE_SIZING, TOOL_TIMEOUT_MARGIN_MS, toolTimeoutMs } from '../../infra/aws/stages.js';

const settings = (context: Record<string, unknown>) => fleetSettings((k) => context[k]);

describe('fleetSettings', () => {
  it('fills the documented defaults from an empty context', () => {
    expect(settings({})).toEqual({
      concurrency: { fetch: 10, template: 10, deploy: 10, 'index-repo': 5, install: 5 },
      kubeconfigPath: DEFAULT_KUBECONFIG_PATH,
      logRetentionDays: 30,
      artifactRetentionDays: 30,
    });
  });

  it('parses command-line strings: lists, numbers, JSON', () => {
    const s = settings({
      clusters: ' east-1, west-2 ,',
      concurrency: '{"deploy": 40}',
      logRetentionDays: '90',
      artifactRetentionDays: '7',
      kubeconfigPath: '/opt/fleet/kubeconfig',
      clusterLayerArn: 'arn:aws:lambda:eu-west-1:123456789012:layer:fleet-kubeconfig:3',
      alarmTopicArn: 'arn:aws:sns:eu-west-1:123456789012:kapp-lambda-alarms',
    });
    expect(s).toEqual({
      clusters: ['east-1', 'west-2'],
      concurrency: { fetch: 10, template: 10, deploy: 40, 'index-repo': 5, install: 5 },
      kubeconfigPath: '/opt/fleet/kubeconfig',
      clusterLayerArn: 'arn:aws:lambda:eu-west-1:123456789012:layer:fleet-kubeconfig:3',
      logRetentionDays: 90,
      artifactRetentionDays: 7,
      alarmTopicArn: 'arn:aws:sns:eu-west-1:123456789012:kapp-lambda-alarms',
    });
  });

  it('applies one concurrency number to every function, as cdk.json values arrive', () => {
    expect(Object.values(settings({ concurrency: 25 }).concurrency)).toEqual(PIPELINE_STAGES.map(() => 25));
    expect(settings({ concurrency: '3' }).concurrency.install).toBe(3);
  });

  it('names every invalid key', () => {
    const bad = {
      clusters: 'East_1',
      concurrency: '1',
      kubeconfigPath: 'kubeconfig',
      logRetentionDays: '31',
      alarmTopicArn: 'arn:aws:sqs:eu-west-1:123456789012:q',
    };
    expect(() => settings(bad)).toThrow(FleetContextError);
    try {
      settings(bad);
    } catch (err) {
      expect((err as FleetContextError).problems).toEqual([
        'clusters.0: expected DNS-1123 labels',
        'concurrency: expected an integer from 2 to 1000, or a JSON object of function → integer',
        'kubeconfigPath: expected an absolute path',
        `logRetentionDays: expected one of 1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653`,
        'alarmTopicArn: expected an sns ARN',
      ]);
    }
  });

  it('refuses a per-function concurrency for a function that does not exist', () => {
    expect(() => settings({ concurrency: '{"render": 5}' })).toThrow(/concurrency/);
  });
});

describe('kubeconfigClusterAccess', () => {
  it('gives the kubeconfig path, the served clusters and the layer holding the file', () => {
    expect(
      kubeconfigClusterAccess({
        kubeconfigPath: '/opt/k/kubeconfig',
        clusters: ['a', 'b'],
        clusterLayerArn: 'arn:aws:lambda:eu-west-1:123456789012:layer:k:1',
      }),
    ).toEqual({
      environment: { KAPP_LAMBDA_KUBECONFIG: '/opt/k/kubeconfig', KAPP_LAMBDA_CLUSTERS: 'a,b' },
      layerArns: ['arn:aws:lambda:eu-west-1:123456789012:layer:k:1'],
    });
    expect(kubeconfigClusterAccess({ kubeconfigPath: '/k' })).toEqual({
      environment: { KAPP_LAMBDA_KUBECONFIG: '/k' },
      layerArns: [],
    });
  });
});

describe('stage sizing', () => {
  it('keeps every tool timeout inside its function timeout, and none for a function without tools', () => {
    for (const stage of PIPELINE_STAGES) {
      const t = toolTimeoutMs(stage);
      if (STAGE_TOOLS[stage].length === 0) expect(t).toBeUndefined();
      else expect(t).toBe(STAGE_SIZING[stage].timeoutSeconds * 1000 - TOOL_TIMEOUT_MARGIN_MS);
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
      expect(s.concurrency).toBeGreaterThanOrEqual(2);
    }
  });

  it('routes the forwarders to the entry function of each kind', () => {
    expect(FORWARDER_STAGES).toEqual(['fetch', 'install', 'index-repo']);
  });
});
