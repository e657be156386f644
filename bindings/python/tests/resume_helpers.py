"""What the elastic-resume tests share: one pass on W ranks, and the same pass stopped after a
few steps and resumed on W' ranks from rank 0's state."""

import itertools


def elastic_resume(ranks, rows, w_from, w_to, head_steps=5):
    """``(head, tail, whole)``: the rows of every step of a pass on ``w_from`` ranks
    (``whole``), of its first ``head_steps`` steps (``head``), and of the ``w_to`` ranks
    resumed from rank 0's state after them (``tail``), each step's ranks in rank order.
    ``ranks(world)`` makes a world's loaders, ``rows(step)`` a step's rows as a list."""

    def run(loaders, steps=None):
        # No step past `steps` is received.
        per_rank = [[rows(step) for step in itertools.islice(ld, steps)] for ld in loaders]
        return [r for step in zip(*per_rank) for batch in step for r in batch]

    whole = run(ranks(w_from))
    first = ranks(w_from)
    head = run(first, head_steps)
    rest = ranks(w_to)
    for ld in rest:
        ld.load_state_dict(first[0].state_dict())
    return head, run(rest), whole
