/**
 * Condition types, finalizers and annotations that are part of the API contract: kapp's wait
 * rules, `kubectl wait`, kctrl and existing manifests depend on these exact strings.
 *
 * Sources: `pkg/apis/kappctrl/v1alpha1/status.go` (condition types), reference Appendix B
 * (finalizers and annotations), `pkg/packageinstall/app.go` and `packageinstall.go`
 * (PackageInstall annotations).
 *
 * @module
 */

/** `status.conditions[].type` values (`ConditionType` in `status.go`). */
export const ConditionType = {
  Reconciling: 'Reconciling',
  ReconcileFailed: 'ReconcileFailed',
  ReconcileSucceeded: 'ReconcileSucceeded',
  Deleting: 'Deleting',
  DeleteFailed: 'DeleteFailed',
} as const;

/**
 * One of the {@link ConditionType} values: the condition types an App, PackageInstall or
 * PackageRepository can carry.
 */
export type ConditionType = (typeof ConditionType)[keyof typeof ConditionType];

/**
 * Condition types kapp-lambda adds to an App's or PackageInstall's `status.conditions`, always
 * after kapp-controller's own (which stays `conditions[0]`: kapp, kctrl and `kubectl wait` read
 * that one). Not part of upstream's API.
 */
export const KappLambdaConditionType = {
  /** On PackageInstalls gated by a rollout policy: `Held`, `Upgrading`, `Soaking`, `Stopped` or `Completed`. */
  Rollout: 'kapp-lambda.carvel.dev/Rollout',
  /** The health of what was deployed, after the reconcile (`True`, `False`, `Unknown`). */
  Healthy: 'kapp-lambda.carvel.dev/Healthy',
} as const;

/** `status.conditions[].status` values (`corev1.ConditionStatus`); kapp-controller only writes `True`. */
export const ConditionStatus = {
  True: 'True',
  False: 'False',
  Unknown: 'Unknown',
} as const;

/** Finalizers each kind gets before its first deploy (upstream names, kept for compatibility). */
export const Finalizer = {
  /** On Apps: block deletion until `kapp delete` succeeds. */
  App: 'finalizers.kapp-ctrl.k14s.io/delete',
  /** On PackageInstalls: delete the App first. */
  PackageInstall: 'finalizers.packageinstall.packaging.carvel.dev/delete',
  /** On PackageRepositories: `kapp delete <name>.pkgr`. */
  PackageRepository: 'finalizers.packagerepository.packaging.carvel.dev/delete',
  /** Legacy PackageRepository finalizer, still removed when present. */
  PackageRepositoryLegacy: 'finalizers.packaging.carvel.dev/delete',
} as const;

/** Annotations read or written by the reconcilers. Keys ending in `-` take a suffix or index. */
export const Annotation = {
  /** On Apps generated for a PackageInstall: the Package's refName. */
  PackageRefName: 'packaging.carvel.dev/package-ref-name',
  /** On Apps generated for a PackageInstall: the Package's version. */
  PackageVersion: 'packaging.carvel.dev/package-version',
  /** On Packages/PackageMetadatas from a repository: `<ns>/<name>` of the PackageRepository. */
  PackageRepositoryRef: 'packaging.carvel.dev/package-repository-ref',
  /** On Packages/PackageMetadatas: precedence across repositories. */
  Revision: 'packaging.carvel.dev/revision',
  /** On PackageInstalls: allow selecting a version lower than `status.lastAttemptedVersion`. */
  Downgradable: 'packaging.carvel.dev/downgradable',
  /** On PackageInstalls: skip the Package's `kubernetesVersionSelection`. */
  IgnoreKubernetesVersionSelection: 'packaging.carvel.dev/ignore-kubernetes-version-selection',
  /** On PackageInstalls: skip the Package's `kappControllerVersionSelection`. */
  IgnoreKappControllerVersionSelection: 'packaging.carvel.dev/ignore-kapp-controller-version-selection',
  /** On PackageInstalls (optionally `.<suffix>`): secret added as ytt `inline.pathsFrom`. */
  YttPathsFromSecretName: 'ext.packaging.carvel.dev/ytt-paths-from-secret-name',
  /** On PackageInstalls: values go to ytt `inline.pathsFrom` instead of `valuesFrom`. */
  YttDataValuesOverlays: 'ext.packaging.carvel.dev/ytt-data-values-overlays',
  /** On PackageInstalls: override helmTemplate `name`. */
  HelmTemplateName: 'ext.packaging.carvel.dev/helm-template-name',
  /** On PackageInstalls: override helmTemplate `namespace`. */
  HelmTemplateNamespace: 'ext.packaging.carvel.dev/helm-template-namespace',
  /** On PackageInstalls (optionally `.<suffix>`): extra helm `valuesFrom` secrets. */
  HelmTemplateValuesFromSecretName: 'ext.packaging.carvel.dev/helm-template-values-from-secret-name',
  /** On PackageInstalls: prefix of `ext.packaging.carvel.dev/fetch-<i>-secret-name`. */
  FetchSecretNamePrefix: 'ext.packaging.carvel.dev/fetch-',
  /** On Apps: the PackageInstall stops updating the App. */
  ManuallyControlled: 'ext.packaging.carvel.dev/manually-controlled',
  /**
   * Ours, on Apps, PackageRepositories and PackageInstalls (copied to the PackageInstall's App):
   * `periodic` (upstream's reconcile every `syncPeriod`) or `exception` (quiet at the sync period
   * while nothing changed, `events/forwarder/quiet.ts`).
   */
  SyncMode: 'kapp-lambda.carvel.dev/sync-mode',
  /** Ours, on the same objects: the safety period (Go duration) of a quiet one. */
  SafetySyncPeriod: 'kapp-lambda.carvel.dev/safety-sync-period',
  /** On namespaces: hide global packages there. */
  ExcludeGlobalPackages: 'kapp-controller.carvel.dev/exclude-global-packages',
  /** On the PackageRepository CRD: the packaging global namespace (read by kctrl). */
  GlobalNamespace: 'packaging.carvel.dev/global-namespace',
} as const;

/**
 * What `AttachErrorf` puts in place of the error when a tool exits with `exit status 1`, and the
 * condition message of a failure whose detail is in `usefulErrorMessage` (an App's failure
 * mirrored on its PackageInstall, a refused downgrade).
 */
export const GENERIC_ERROR_DETAIL = 'Error (see .status.usefulErrorMessage for details)';

/** Default packaging global namespace (upstream `-packaging-global-namespace`). */
export const DEFAULT_PACKAGING_GLOBAL_NAMESPACE = 'kapp-controller-packaging-global';

/**
 * kapp's field manager name (kapp does not set one, so the API server takes its user agent's
 * program name): the deploy record and the forwarder's drift watches tell kapp's writes from
 * others' by it.
 */
export const KAPP_FIELD_MANAGER = 'kapp';

/** The annotation naming the receipt whose render the App is rolled back to (`../pipeline/app/receipts.ts`). */
export const ROLLBACK_TO_ANNOTATION = 'kapp-lambda.carvel.dev/rollback-to';
/** The App's generation when the rollback was asked: a later spec ends it. */
export const ROLLBACK_GENERATION_ANNOTATION = 'kapp-lambda.carvel.dev/rollback-generation';
