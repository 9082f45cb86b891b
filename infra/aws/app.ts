/**
 * The CDK app (`infra/cdk.json`: `cd infra && npx aws-cdk@2 synth|deploy`): bundles the
 * functions and the dispatchers (`functions/dispatch/`), takes the layers `npm run build:layers` built on this host, reads the fleet
 * settings from context (`./fleet.ts`) and synthesizes {@link KappLambdaStack} with cdk-nag's
 * AwsSolutions checks (a validation plugin: an unacknowledged finding fails the synth).
 *
 * Context beyond the fleet settings: `stackName` (default `KappLambda`); `fleetPage` (`true`: the
 * fleet page behind a Function URL with `AuthType: AWS_IAM`, `./fleet-page.ts`, its function
 * bundled only then; default `false`). Account and region come from the CLI's environment
 * (`CDK_DEFAULT_ACCOUNT`, `CDK_DEFAULT_REGION`).
 *
 * @module
 */
import path from 'node:path';
import { App, aws_lambda as lambda, Validations } from 'aws-cdk-lib';
import { AwsSolutionsChecks } from 'cdk-nag';
import { PIPELINE_STAGES } from '../../functions/lib/api/functions.js';
import { bundleFunctions } from '../../layers/bundle.js';
import { cacheRoot } from '../../layers/gobuild.js';
import { builtLayers, stageAssets } from './assets.js';
import { fleetSettings } from './fleet.js';
import { fleetPageContext } from './fleet-page.js';
import { KappLambdaStack } from './stack.js';

/**
 * The architecture of the functions: the host's, because the layers hold tools `go install`
 * built for it (`layers/build.ts` does not cross-compile).
 * @throws Error on a host Lambda does not run (neither x64 nor arm64).
 */
export function hostArchitecture(arch: string = process.arch): lambda.Architecture {
  if (arch === 'x64') return lambda.Architecture.X86_64;
  if (arch === 'arm64') return lambda.Architecture.ARM_64;
  throw new Error(`the layers are built for ${arch}, which Lambda does not run`);
}

const root = cacheRoot();
const app = new App();
const layers = builtLayers(path.join(root, 'layers'));
const fleetPage = fleetPageContext(app.node.tryGetContext('fleetPage'));
const {
  dispatch,
  'fleet-page': fleetPageCodeDir,
  ...code
} = await bundleFunctions(
  [...PIPELINE_STAGES, 'dispatch', ...(fleetPage ? ['fleet-page' as const] : [])],
  path.join(root, 'cdk-bundles'),
);
new KappLambdaStack(app, String(app.node.tryGetContext('stackName') ?? 'KappLambda'), {
  env: { account: process.env.CDK_DEFAULT_ACCOUNT, region: process.env.CDK_DEFAULT_REGION },
  assets: stageAssets(code, layers),
  dispatcherCodeDir: dispatch,
  ...(fleetPage ? { fleetPageCodeDir } : {}),
  architecture: hostArchitecture(),
  fleet: fleetSettings((k) => app.node.tryGetContext(k)),
});
Validations.of(app).addPlugins(new AwsSolutionsChecks(app));
app.synth();
