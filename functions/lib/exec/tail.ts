/**
 * A bounded accumulator of streamed text, for callers of `RunRequest.onOutput` that keep what a
 * tool printed so far (kapp's progress copied into `status.deploy`): memory stays bounded
 * however much a tool prints, and the tail (where kapp's summary and errors are) survives.
 *
 * @module
 */

/**
 * Keeps the newest `maxChars` UTF-16 code units of the text appended to it (amortized O(1)
 * per character: the buffer is cut back to `maxChars` once it reaches twice that). A cut never
 * splits a surrogate pair. Also remembers whether `marker` ever appeared in the whole stream,
 * including across chunk boundaries and in parts already dropped.
 */
export class TextTail {
  #text = '';
  #truncated = false;
  #seen = false;
  readonly #max: number;
  readonly #marker: string;

  /**
   * @param maxChars - Bound in UTF-16 code units (at most 3 UTF-8 bytes each); at least 1.
   * @param marker - Text whose first appearance is remembered ({@link TextTail.seen}); `''` for none.
   */
  constructor(maxChars: number, marker = '') {
    this.#max = Math.max(1, Math.floor(maxChars));
    this.#marker = marker;
  }

  /** Appends a chunk. */
  push(chunk: string): void {
    if (chunk === '') return;
    if (!this.#seen && this.#marker !== '') {
      // The marker may straddle the previous chunk and this one.
      const carry = this.#marker.length > 1 ? this.#text.slice(-(this.#marker.length - 1)) : '';
      this.#seen = (carry + chunk).includes(this.#marker);
    }
    this.#text += chunk;
    if (this.#text.length >= 2 * this.#max) this.#cut();
  }

  #cut(): void {
    if (this.#text.length <= this.#max) return;
    let start = this.#text.length - this.#max;
    const unit = this.#text.charCodeAt(start);
    if (unit >= 0xdc00 && unit <= 0xdfff) start++;
    this.#text = this.#text.slice(start);
    this.#truncated = true;
  }

  /** The kept text: at most `maxChars` code units, the newest ones. */
  text(): string {
    this.#cut();
    return this.#text;
  }

  /** Whether older text was dropped. */
  get truncated(): boolean {
    this.#cut();
    return this.#truncated;
  }

  /** Whether the marker appeared anywhere in the stream so far. */
  get seen(): boolean {
    return this.#seen;
  }
}
