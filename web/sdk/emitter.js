// A small typed event emitter (browsers and Node alike, no DOM events).

/** @template {Record<string, any>} Events */
export class Emitter {
  /** @type {Map<keyof Events, Set<(v: any) => void>>} */
  #handlers = new Map();

  /**
   * on registers fn for type; the returned function removes it.
   * @template {keyof Events} K
   * @param {K} type
   * @param {(value: Events[K]) => void} fn
   * @returns {() => void}
   */
  on(type, fn) {
    let set = this.#handlers.get(type);
    if (!set) this.#handlers.set(type, (set = new Set()));
    set.add(fn);
    return () => { set.delete(fn); };
  }

  /**
   * emit calls every handler of type; a throwing handler does not stop the others.
   * @template {keyof Events} K
   * @param {K} type
   * @param {Events[K]} value
   */
  emit(type, value) {
    for (const fn of [...(this.#handlers.get(type) || [])]) {
      try {
        fn(value);
      } catch (e) {
        queueMicrotask(() => { throw e; });
      }
    }
  }
}
