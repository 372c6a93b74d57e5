"""The order of forwards (F), backwards (B) and weight-gradient units (W)
one pipeline stage runs, computed from the schedules' definitions (for the
pipeline tests)."""


def interleaved(stages, stage, micro_batches, chunks):
    """Interleaved 1F1B with `chunks` model chunks per stage ("F3c1": micro-
    batch 3's forward through chunk 1). The stage's forwards go in rounds of
    `stages` micro-batches, chunk 0's round, chunk 1's, ..., then the next
    micro-batches; its backwards likewise from the last chunk down. It warms
    up with 2 (p - s - 1) + (v - 1) p forwards (all of them when the
    micro-batches are one round), then alternates, then cools down."""
    def unit(i, kind):
        round_ = i // stages
        chunk = round_ % chunks
        if kind == "B":
            chunk = chunks - 1 - chunk
        return f"{kind}{round_ // chunks * stages + i % stages}c{chunk}"
    total = micro_batches * chunks
    warmup = total if micro_batches == stages else min(total, 2 * (stages - stage - 1) + (chunks - 1) * stages)
    order = [unit(i, "F") for i in range(warmup)]
    for i in range(warmup, total):
        order += [unit(i, "F"), unit(i - warmup, "B")]
    return order + [unit(i, "B") for i in range(total - warmup, total)]


def reference(schedule, stages, stage, micro_batches):
    """GPipe: every forward, then every backward. 1F1B: stage s warms up
    with p - s - 1 forwards, then alternates one forward and one backward,
    then cools down with the remaining backwards. ZB-H1: 1F1B's order, with
    W of micro-batch k right after B of k + s and the last s at the end; the
    first stage sends no gradient back, so its backwards are all W (no B
    runs there)."""
    if schedule == "zb_h1":
        order = []
        for unit in reference("1f1b", stages, stage, micro_batches):
            if unit[0] == "B":
                if stage > 0:
                    order.append(unit)
                if int(unit[1:]) - stage >= 0:
                    order.append(f"W{int(unit[1:]) - stage}")
            else:
                order.append(unit)
        return order + [f"W{k}" for k in range(max(0, micro_batches - stage), micro_batches)]
    if schedule == "gpipe":
        return [f"F{k}" for k in range(micro_batches)] + [f"B{k}" for k in range(micro_batches)]
    warmup = min(stages - stage - 1, micro_batches)
    order = [f"F{k}" for k in range(warmup)]
    for k in range(warmup, micro_batches):
        order += [f"F{k}", f"B{k - warmup}"]
    return order + [f"B{k}" for k in range(micro_batches - warmup, micro_batches)]
