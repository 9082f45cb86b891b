/**
 * `spec.template[]` types (`AppTemplate`, upstream `types_template.go`), re-exported from the zod
 * schemas in `functions/lib/api/` under the names the template planners use.
 *
 * @module
 */
import type * as api from '../api/index.js';

/** `AppTemplateValuesSourceRef`: a Secret or ConfigMap (`name`) whose every key is a values file. */
export type ValuesSourceRef = api.LocalRef;

/**
 * `AppTemplateValuesDownwardAPIItem`: `name` (nested with `.`, `\.` literal; fieldPath only) and one
 * of `fieldPath`, `kubernetesVersion{version?}`, `kappControllerVersion{version?}`,
 * `kubernetesAPIs{groupVersions?}`.
 */
export type DownwardAPIItem = api.AppTemplateValuesDownwardAPIItem;

/** `AppTemplateValuesSource`: one of `secretRef`, `configMapRef`, `path` (`-` = stdin), `downwardAPI`. */
export type ValuesSource = api.AppTemplateValuesSource;

/**
 * `AppTemplateYtt`: `ignoreUnknownComments`, `strict` (accepted, unused upstream), `inline`, `paths`,
 * `fileMarks`, `valuesFrom`.
 */
export type AppTemplateYtt = api.AppTemplateYtt;

/** `AppTemplateKbld`: `paths`. */
export type AppTemplateKbld = api.AppTemplateKbld;

/**
 * `AppTemplateHelmTemplate`: `name`, `namespace`, `path`, `valuesFrom`, `kubernetesVersion`,
 * `kubernetesAPIs`.
 */
export type AppTemplateHelmTemplate = api.AppTemplateHelmTemplate;

/** `AppTemplateSopsPrivateKeysSecretRef`: `name`. */
export type SopsPrivateKeysSecretRef = api.AppTemplateSopsPrivateKeysSecretRef;

/** `AppTemplateSops`: `pgp.privateKeysSecretRef` or `age.privateKeysSecretRef`, `paths`. */
export type AppTemplateSops = api.AppTemplateSops;

/** `AppTemplateCue`: `paths`, `valuesFrom`, `inputExpression`, `outputExpression`. */
export type AppTemplateCue = api.AppTemplateCue;

/** One `spec.template[]` entry (`AppTemplate`): exactly one templater. */
export type AppTemplate = api.AppTemplate;
