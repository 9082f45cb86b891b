/**
 * An indexed binary min-heap of due times: the forwarder's one timer source for every watched
 * object (one `setTimeout` for the earliest entry, not one per object).
 *
 * Items carry their own heap position (`heapIndex`), so rescheduling an object (every status
 * write of an App reschedules it) is an O(log n) update in place that leaves no stale entries
 * behind: the heap never holds more entries than there are objects.
 *
 * @module
 */

/** What the heap stores: the due time and the item's own position. */
export interface HeapItem {
  /** Due time in milliseconds since the epoch. */
  due: number;
  /** Position in the heap; -1 when not in it. Owned by {@link DueHeap}. */
  heapIndex: number;
}

/** Min-heap on {@link HeapItem.due}. */
export class DueHeap<T extends HeapItem> {
  private readonly items: T[] = [];

  /** Number of scheduled items. */
  get size(): number {
    return this.items.length;
  }

  /** The earliest item, or `undefined` when empty. */
  peek(): T | undefined {
    return this.items[0];
  }

  /**
   * Schedules `item` at `due`, or moves it there if it is already scheduled.
   *
   * @param item - The item; its `due` and `heapIndex` are updated.
   * @param due - Milliseconds since the epoch; must be finite.
   */
  set(item: T, due: number): void {
    const old = item.due;
    item.due = due;
    if (item.heapIndex < 0) {
      item.heapIndex = this.items.length;
      this.items.push(item);
      this.up(item.heapIndex);
    } else if (due < old) {
      this.up(item.heapIndex);
    } else if (due > old) {
      this.down(item.heapIndex);
    }
  }

  /** Unschedules `item`; a no-op when it is not scheduled. */
  delete(item: T): void {
    const i = item.heapIndex;
    if (i < 0) return;
    const last = this.items.pop()!;
    item.heapIndex = -1;
    if (i === this.items.length) return;
    this.items[i] = last;
    last.heapIndex = i;
    this.down(i);
    this.up(last.heapIndex);
  }

  /** Removes and returns the earliest item if it is due at `now`, else `undefined`. */
  popDue(now: number): T | undefined {
    const top = this.items[0];
    if (!top || top.due > now) return undefined;
    this.delete(top);
    return top;
  }

  private up(i: number): void {
    const items = this.items;
    const item = items[i]!;
    while (i > 0) {
      const p = (i - 1) >> 1;
      const parent = items[p]!;
      if (parent.due <= item.due) break;
      items[i] = parent;
      parent.heapIndex = i;
      i = p;
    }
    items[i] = item;
    item.heapIndex = i;
  }

  private down(i: number): void {
    const items = this.items;
    const n = items.length;
    const item = items[i]!;
    for (;;) {
      const l = 2 * i + 1;
      if (l >= n) break;
      const r = l + 1;
      const c = r < n && items[r]!.due < items[l]!.due ? r : l;
      const child = items[c]!;
      if (child.due >= item.due) break;
      items[i] = child;
      child.heapIndex = i;
      i = c;
    }
    items[i] = item;
    item.heapIndex = i;
  }
}
