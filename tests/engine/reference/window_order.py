# Independent reference for the shuffled window order of an epoch (engine/src/data/window_order.h):
# a pure-Python std::mt19937_64, splitmix64 seeding and the same Fisher-Yates with rejection
# sampling. Usage: window_order.py WINDOWS SEED EPOCH  -> the order, space separated.
import sys

M64 = (1 << 64) - 1


class MT19937_64:
    N, M = 312, 156
    A = 0xB5026F5AA96619E9
    UPPER, LOWER = M64 ^ ((1 << 31) - 1), (1 << 31) - 1

    def __init__(self, seed):
        self.mt = [seed & M64]
        for i in range(1, self.N):
            prev = self.mt[-1]
            self.mt.append((6364136223846793005 * (prev ^ (prev >> 62)) + i) & M64)
        self.idx = self.N

    def _twist(self):
        mt = self.mt
        for i in range(self.N):
            x = (mt[i] & self.UPPER) | (mt[(i + 1) % self.N] & self.LOWER)
            xa = x >> 1
            if x & 1:
                xa ^= self.A
            mt[i] = mt[(i + self.M) % self.N] ^ xa
        self.idx = 0

    def __call__(self):
        if self.idx >= self.N:
            self._twist()
        y = self.mt[self.idx]
        self.idx += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & M64


def splitmix(z):
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def window_order(n, seed, epoch):
    order = list(range(n))
    rng = MT19937_64(splitmix(splitmix(seed) ^ (epoch & M64)))
    for i in range(n - 1, 0, -1):
        bound = i + 1
        limit = M64 - (M64 % bound)
        r = rng()
        while r >= limit:
            r = rng()
        j = r % bound
        order[i], order[j] = order[j], order[i]
    return order


if __name__ == "__main__":
    check = MT19937_64(5489)  # the C++ standard's required 10000th output of mt19937_64
    for _ in range(9999):
        check()
    assert check() == 9981545732273789042, "mt19937_64 reference is wrong"
    n, seed, epoch = (int(a) for a in sys.argv[1:4])
    print(" ".join(str(v) for v in window_order(n, seed, epoch)))
