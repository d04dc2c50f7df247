"""Value sizes of the workloads: ``--size`` as a fixed size, a range or a weighted list.

``parse_sizes(text)`` -> :class:`Sizes`; ``Sizes.table(slots, rng)`` gives the size of each
of the ``slots`` distinct payloads a run uses (a payload is a pure function of its key, so
every answer can be checked), drawn from the distribution:

- ``1536``: every value 1536 bytes;
- ``100-4000``: uniform between 100 and 4000 bytes, both included;
- ``100:70,1000:25,10000:5``: 100 bytes with weight 70, 1000 with 25, 10000 with 5.
"""
import bisect
import itertools
import math

MAX_SLOTS = 100_003   # distinct payloads of a weighted list at most


class Sizes:
    """A distribution of value sizes in bytes.

    :param kind: "fixed", "range" or "weighted"
    :param values: (size,), (low, high) or ((size, weight), ...)
    """

    def __init__(self, kind, values, text):
        self.kind, self.values, self.text = kind, values, text

    @property
    def largest(self):
        if self.kind == "weighted":
            return max(size for size, _ in self.values)
        return self.values[-1]

    @property
    def mean(self):
        if self.kind == "fixed":
            return float(self.values[0])
        if self.kind == "range":
            return (self.values[0] + self.values[1]) / 2
        total = sum(w for _, w in self.values)
        return sum(size * w for size, w in self.values) / total

    def draw(self, rng):
        """One size drawn with ``rng`` (a ``random.Random``)."""
        if self.kind == "fixed":
            return self.values[0]
        if self.kind == "range":
            return rng.randint(*self.values)
        sizes = [size for size, _ in self.values]
        cumulative = list(itertools.accumulate(w for _, w in self.values))
        return sizes[bisect.bisect_right(cumulative, rng.random() * cumulative[-1])]

    def slots(self, least):
        """How many distinct payloads keep the weights exactly: at least ``least``, and
        enough that the smallest weight gets a whole payload (a prime, so neighbouring
        keys never share one); at most ``MAX_SLOTS``."""
        if self.kind != "weighted":
            return least
        total = sum(w for _, w in self.values)
        smallest = min((w for _, w in self.values if w > 0), default=total)
        n = min(MAX_SLOTS, max(least, math.ceil(total / smallest - 1e-9)))
        while any(n % d == 0 for d in range(2, int(n ** 0.5) + 1)):
            n += 1
        return n

    def table(self, slots, rng):
        """The sizes of ``slots`` payloads; a weighted list is spread over them in
        proportion (not by chance, the largest remainders rounded up), so the shares
        are the weights to within one payload in ``slots``."""
        if self.kind != "weighted":
            return [self.draw(rng) for _ in range(slots)]
        total = sum(w for _, w in self.values)
        exact = [slots * w / total for _, w in self.values]
        counts = [int(e) for e in exact]
        by_remainder = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
        for i in by_remainder[:slots - sum(counts)]:
            counts[i] += 1
        out = []
        for (size, _), n in zip(self.values, counts):
            out += [size] * n
        rng.shuffle(out)
        return out

    def __str__(self):
        return self.text


def parse_sizes(text):
    """``"1536"``, ``"100-4000"`` or ``"100:70,1000:25"`` -> :class:`Sizes`.

    :raises ValueError: not one of these forms, or a size below 1 or a weight below 0
    """
    text = str(text).strip()
    try:
        if "," in text or ":" in text:
            pairs = []
            for part in text.split(","):
                size, sep, weight = part.partition(":")
                pairs.append((int(size), float(weight) if sep else 1.0))
            if min(s for s, _ in pairs) < 1 or min(w for _, w in pairs) < 0 \
                    or sum(w for _, w in pairs) <= 0:
                raise ValueError
            return Sizes("weighted", tuple(pairs), text)
        if "-" in text:
            low, high = (int(v) for v in text.split("-"))
            if not 1 <= low <= high:
                raise ValueError
            return Sizes("range", (low, high), text)
        size = int(text)
        if size < 1:
            raise ValueError
        return Sizes("fixed", (size,), text)
    except ValueError:
        raise ValueError("size must be BYTES, LOW-HIGH or BYTES:WEIGHT,... with sizes >= 1, "
                         "got %r" % text) from None
