/** Random words and the draws every SDK makes from them (docs/device-protocol.md, "Draws"). */

const M64 = (1n << 64n) - 1n;
const TWO53 = 2 ** 53;

/** A source of uniform 64-bit words. */
export interface DrawSource {
  nextU64(): bigint;
}

/** SplitMix64 seeded by a u64: the specified deterministic test generator. */
export class SplitMix64 implements DrawSource {
  private state: bigint;

  constructor(seed: bigint) {
    this.state = BigInt.asUintN(64, seed);
  }

  nextU64(): bigint {
    this.state = (this.state + 0x9e3779b97f4a7c15n) & M64;
    let z = this.state;
    z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
    z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
    return z ^ (z >> 31n);
  }
}

/** Words from the platform CSPRNG (crypto.getRandomValues): the production generator. */
export class OsRandom implements DrawSource {
  private readonly buf = new BigUint64Array(64);
  private pos = 64;

  nextU64(): bigint {
    if (this.pos === this.buf.length) {
      globalThis.crypto.getRandomValues(this.buf);
      this.pos = 0;
    }
    return this.buf[this.pos++];
  }
}

/** Uniform in [0, k), 1 <= k <= 2^32: words >= 2^64 - (2^64 mod k) are rejected. */
export function uniform(rng: DrawSource, k: number): number {
  const kk = BigInt(k);
  const limit = (1n << 64n) - ((1n << 64n) % kk);
  for (;;) {
    const w = rng.nextU64();
    if (w < limit) return Number(w % kk);
  }
}

function fraction(rng: DrawSource): number {
  return Number(rng.nextU64() >> 11n);
}

/** True with probability p: (w >> 11) < p * 2^53. */
export function bernoulli(rng: DrawSource, p: number): boolean {
  return fraction(rng) < p * TWO53;
}

/** The first j with (w >> 11) < cum[j] * 2^53, else the last index. */
export function categorical(rng: DrawSource, cum: ArrayLike<number>, offset = 0,
                            k = cum.length): number {
  const u = fraction(rng);
  for (let j = 0; j < k - 1; j++) if (u < cum[offset + j] * TWO53) return j;
  return k - 1;
}
