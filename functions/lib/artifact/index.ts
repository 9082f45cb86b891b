/**
 * Content-addressed artifacts: keys, the render-input hash, deterministic tarballs.
 */
export {
  type ArtifactKind,
  canonicalJson,
  FETCH_KEY_PATTERN,
  fetchArtifactKey,
  INDEX_KEY_PATTERN,
  INDEX_MANIFEST_KEY_PATTERN,
  INDEX_RECORD_KEY_PATTERN,
  isSha256Hex,
  parseArtifactKey,
  RENDER_CACHE_KEY_PATTERN,
  type RenderInputs,
  renderCacheKey,
  renderInputHash,
  repoIndexKey,
  repoIndexManifestKey,
  repoIndexRecordKey,
  SHA256_HEX_PATTERN,
  sha256Hex,
  TEMPLATE_KEY_PATTERN,
  templateArtifactKey,
} from './keys.js';
export {
  ArtifactError,
  type ArtifactErrorCode,
  type ArtifactLimits,
  DEFAULT_MAX_ARTIFACT_BYTES,
  DEFAULT_MAX_ARTIFACT_ENTRIES,
  type PackedDir,
  packDir,
  tarSha256,
  type UnpackResult,
  unpackTarball,
} from './tarball.js';
