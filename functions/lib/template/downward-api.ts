/**
 * `valuesFrom[].downwardAPI`: values taken from the App's metadata or from the cluster, each
 * rendered as one small YAML document.
 *
 * Mirrors kapp-controller `pkg/template/downward_api_values.go` (`AsYAMLs`, `validateName`,
 * `relaxedJSONPathExpression`, `nestedKeyValue`, `splitWithEscaping`). The JSONPath evaluation is
 * a faithful subset of `k8s.io/client-go/util/jsonpath` over upstream's `PartialObjectMetadata`
 * (field and `['key']` steps, `\.` escapes); wildcards, filters, slices and recursive descent are
 * rejected (over this object they could only yield a multi-value result, which upstream rejects
 * too, or an empty one).
 *
 * @module
 */
import { stringify } from 'yaml';
import type { AppTemplateValuesDownwardAPIItem } from '../api/template.js';

/** The metadata fields the template planners read from an App (downward API, vendir cache key). */
export interface AppMetadataLike {
  name?: string;
  namespace?: string;
  /** Vendir cache key, downward API `metadata.uid`. */
  uid?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

/**
 * Values the downward API (and helm's `--kube-version`/`--api-versions`) read from outside the App.
 * Each is the value, an `Error` whose message becomes the failure text (a failed lookup), or
 * `undefined` when the caller did not look it up (a programming error if it is then needed: use
 * `requiredClusterInfo` to know which are needed).
 */
export interface ClusterInfo {
  /** Live Kubernetes version, `major.minor.patch` without pre-release or build (e.g. `1.34.1`). */
  kubernetesVersion?: string | Error;
  /** Live API group/versions (e.g. `['v1', 'apps/v1', ...]`). */
  kubernetesAPIs?: string[] | Error;
  /** Version of the running controller. */
  kappControllerVersion?: string | Error;
}

/** Upstream: `Invalid downward API item given`. */
export const INVALID_DOWNWARD_ITEM_MESSAGE = 'Invalid downward API item given';

/** Upstream: the text for a JSONPath that selects zero or several values. */
export const MULTIPLE_RESULTS_MESSAGE =
  'Invalid field spec provided to DownwardAPI. Only single supported fields are allowed';

/** Upstream's text for a `fieldPath` that does not fit the relaxed JSONPath forms. */
export const BAD_FIELD_PATH_MESSAGE =
  "unexpected path string, expected a 'name1.name2' or '.name1.name2' or '{name1.name2}' or '{.name1.name2}'";

/**
 * Checks an item's `name`: it must not start or end with `.` nor contain `..`.
 *
 * @throws {Error} `Invalid name was provided '<name>' (hint: separate paths should only use a single '.' character)`
 */
export function validateDownwardName(name: string): void {
  if (name.endsWith('.') || name.startsWith('.') || name.includes('..')) {
    throw new Error(
      `Invalid name was provided '${name}' (hint: separate paths should only use a single '.' character)`,
    );
  }
}

/**
 * Splits on `separator`, where `escapeChar` makes the next character literal (Go `splitWithEscaping`;
 * a trailing lone escape is kept).
 */
export function splitWithEscaping(s: string, separator = '.', escapeChar = '\\'): string[] {
  const tokens: string[] = [];
  let token = '';
  for (let i = 0; i < s.length; i++) {
    const c = s[i]!;
    if (c === separator) {
      tokens.push(token);
      token = '';
    } else if (c === escapeChar && i + 1 < s.length) {
      i++;
      token += s[i];
    } else {
      token += c;
    }
  }
  tokens.push(token);
  return tokens;
}

const RELAXED_JSON_PATH = /^\{\.?([^{}]+)\}$|^\.?([^{}]+)$/;

/**
 * Normalises the four accepted spellings (`metadata.name`, `.metadata.name`, `{metadata.name}`,
 * `{.metadata.name}`) to `{.metadata.name}`. Empty stays empty.
 *
 * @throws {Error} {@link BAD_FIELD_PATH_MESSAGE}
 */
export function relaxedJSONPathExpression(pathExpression: string): string {
  if (pathExpression.length === 0) return pathExpression;
  const m = RELAXED_JSON_PATH.exec(pathExpression);
  if (!m) throw new Error(BAD_FIELD_PATH_MESSAGE);
  const fieldSpec = m[1] ? m[1] : (m[2] ?? '');
  return `{.${fieldSpec}}`;
}

/** A node of upstream's `PartialObjectMetadata` as the JSONPath evaluator sees it. */
type Node =
  | { kind: 'string'; value: string }
  | { kind: 'map'; value: Record<string, string> }
  | { kind: 'struct'; fields: Map<string, Node>; yaml: () => Record<string, unknown> };

/** Sets an own property, even for keys such as `__proto__`. */
function setOwn(target: Record<string, unknown>, key: string, value: unknown): void {
  Object.defineProperty(target, key, { value, enumerable: true, writable: true, configurable: true });
}

function stringMap(m: Record<string, string> | undefined): Node {
  const value: Record<string, string> = {};
  for (const k of Object.keys(m ?? {})) setOwn(value, k, m![k]!);
  return { kind: 'map', value };
}

/**
 * Builds the evaluated object: `{kind, apiVersion, metadata: {name, namespace, uid, labels,
 * annotations}}`. Fields are reachable by JSON name and, as Go's `FieldByName` fallback allows, by Go
 * field name (including promoted ones such as `.Name`).
 */
function partialObjectMetadata(meta: AppMetadataLike): Node {
  const name: Node = { kind: 'string', value: meta.name ?? '' };
  const namespace: Node = { kind: 'string', value: meta.namespace ?? '' };
  const uid: Node = { kind: 'string', value: meta.uid ?? '' };
  const labels = stringMap(meta.labels);
  const annotations = stringMap(meta.annotations);
  const empty: Node = { kind: 'string', value: '' };
  const objectMeta: Node = {
    kind: 'struct',
    fields: new Map([
      ['name', name],
      ['namespace', namespace],
      ['uid', uid],
      ['labels', labels],
      ['annotations', annotations],
      ['Name', name],
      ['Namespace', namespace],
      ['UID', uid],
      ['Labels', labels],
      ['Annotations', annotations],
    ]),
    // yaml.v2 marshals a struct with lower-cased field names, in declaration order.
    yaml: () => ({
      name: meta.name ?? '',
      namespace: meta.namespace ?? '',
      uid: meta.uid ?? '',
      labels: (labels as { value: Record<string, string> }).value,
      annotations: (annotations as { value: Record<string, string> }).value,
    }),
  };
  const typeMeta: Node = {
    kind: 'struct',
    fields: new Map([
      ['kind', empty],
      ['apiVersion', empty],
      ['Kind', empty],
      ['APIVersion', empty],
    ]),
    yaml: () => ({ kind: '', apiversion: '' }),
  };
  return {
    kind: 'struct',
    fields: new Map([
      ['kind', empty],
      ['apiVersion', empty],
      ['metadata', objectMeta],
      ['TypeMeta', typeMeta],
      ['ObjectMeta', objectMeta],
      ['Kind', empty],
      ['APIVersion', empty],
      ['Name', name],
      ['Namespace', namespace],
      ['UID', uid],
      ['Labels', labels],
      ['Annotations', annotations],
    ]),
    yaml: () => ({
      typemeta: { kind: '', apiversion: '' },
      objectmeta: (objectMeta as { yaml: () => unknown }).yaml(),
    }),
  };
}

/** Parses the inside of `{...}` into field names (`.a`, `.a\.b`, `['a']`). */
function parseFieldSteps(expr: string): string[] {
  if (!expr.startsWith('{') || !expr.endsWith('}')) throw new Error(`unsupported JSONPath expression ${expr}`);
  const body = expr.slice(1, -1);
  const steps: string[] = [];
  let i = 0;
  while (i < body.length) {
    const c = body[i];
    if (c === '.') {
      i++;
      let name = '';
      while (i < body.length && body[i] !== '.' && body[i] !== '[') {
        if (body[i] === '\\' && i + 1 < body.length) {
          name += body[i + 1];
          i += 2;
        } else {
          name += body[i];
          i++;
        }
      }
      if (name === '' || name === '*' || /[\s,()@$*?]/.test(name)) {
        throw new Error(`unsupported JSONPath expression ${expr}`);
      }
      steps.push(name);
    } else if (c === '[') {
      const m = /^\['([^']*)'\]/.exec(body.slice(i));
      if (!m) throw new Error(`unsupported JSONPath expression ${expr}`);
      steps.push(m[1]!);
      i += m[0].length;
    } else {
      throw new Error(`unsupported JSONPath expression ${expr}`);
    }
  }
  return steps;
}

/** The YAML-able value of a node (as yaml.v2 would marshal it). */
function nodeValue(node: Node): unknown {
  if (node.kind === 'string') return node.value;
  if (node.kind === 'map') return node.value;
  return node.yaml();
}

/**
 * Evaluates `{.a.b}` against the App's metadata, returning the single value.
 *
 * @throws {Error} `<field> is not found` for a missing field or key (k8s JSONPath with
 *   `AllowMissingKeys(false)`); `unsupported JSONPath expression ...` for syntax outside the subset
 */
export function evaluateFieldPath(expression: string, meta: AppMetadataLike): unknown {
  let node: Node = partialObjectMetadata(meta);
  for (const step of parseFieldSteps(expression)) {
    let next: Node | undefined;
    if (node.kind === 'struct') next = node.fields.get(step);
    else if (node.kind === 'map' && Object.hasOwn(node.value, step)) {
      next = { kind: 'string', value: node.value[step]! };
    }
    if (!next) throw new Error(`${step} is not found`);
    node = next;
  }
  return nodeValue(node);
}

/** Nests `value` under the `.`-separated (with `\` escapes) `name`. */
function nestedKeyValue(name: string, value: unknown): Record<string, unknown> {
  const keys = splitWithEscaping(name, '.', '\\');
  const root: Record<string, unknown> = {};
  let cur = root;
  keys.forEach((key, i) => {
    if (i === keys.length - 1) {
      setOwn(cur, key, value);
    } else {
      const next: Record<string, unknown> = {};
      setOwn(cur, key, next);
      cur = next;
    }
  });
  return root;
}

function yamlDoc(value: unknown): string {
  return stringify(value, { sortMapEntries: true, lineWidth: 0 });
}

function live<T>(value: T | Error | undefined, what: string): T {
  if (value instanceof Error) throw new Error(value.message);
  if (value === undefined) {
    throw new TypeError(`downward API: ${what} is needed but was not provided (see requiredClusterInfo)`);
  }
  return value;
}

/**
 * Renders each downward API item as a YAML document (`downwardapi_<idx>.yaml` upstream), in order.
 *
 * - `fieldPath` (checked first): evaluated against the App's metadata; `name` is split on `.` into
 *   nested keys (`\.` is a literal dot). Maps (labels, annotations) render as mappings.
 * - `kubernetesVersion`, `kappControllerVersion`, `kubernetesAPIs`: the explicit value if given,
 *   otherwise the live one from `cluster`. Upstream keys these by the literal `name` (no nesting),
 *   reproduced here.
 *
 * @param items - `downwardAPI.items`
 * @param meta - the App's metadata
 * @param cluster - live values, needed only for items without an explicit value
 * @returns one YAML document per item
 * @throws {Error} the first failing item's upstream text (name validation, path syntax,
 *   `<field> is not found`, {@link MULTIPLE_RESULTS_MESSAGE}, {@link INVALID_DOWNWARD_ITEM_MESSAGE},
 *   or a failed live lookup's message)
 */
export function downwardAPIValuesYaml(
  items: readonly AppTemplateValuesDownwardAPIItem[],
  meta: AppMetadataLike,
  cluster: ClusterInfo,
): string[] {
  return items.map((item) => {
    const name = item.name ?? '';
    validateDownwardName(name);
    if (item.fieldPath) {
      const expression = relaxedJSONPathExpression(item.fieldPath);
      return yamlDoc(nestedKeyValue(name, evaluateFieldPath(expression, meta)));
    }
    if (item.kubernetesVersion) {
      const v = item.kubernetesVersion.version || live(cluster.kubernetesVersion, 'kubernetesVersion');
      return yamlDoc({ [name]: v });
    }
    if (item.kappControllerVersion) {
      const v = item.kappControllerVersion.version || live(cluster.kappControllerVersion, 'kappControllerVersion');
      return yamlDoc({ [name]: v });
    }
    if (item.kubernetesAPIs) {
      const v = item.kubernetesAPIs.groupVersions ?? live(cluster.kubernetesAPIs, 'kubernetesAPIs');
      return yamlDoc({ [name]: [...v] });
    }
    throw new Error(INVALID_DOWNWARD_ITEM_MESSAGE);
  });
}
