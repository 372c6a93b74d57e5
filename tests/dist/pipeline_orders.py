"""The order of forwards (F) and backwards (B) one pipeline stage runs,
computed from the schedules' definitions (for the pipeline tests)."""


def reference(schedule, stages, stage, micro_batches):
    """GPipe: every forward, then every backward. 1F1B: stage s warms up
    with p - s - 1 forwards, then alternates one forward and one backward,
    then cools down with the remaining backwards."""
    if schedule == "gpipe":
        return [f"F{k}" for k in range(micro_batches)] + [f"B{k}" for k in range(micro_batches)]
    warmup = min(stages - stage - 1, micro_batches)
    order = [f"F{k}" for k in range(warmup)]
    for k in range(warmup, micro_batches):
        order += [f"F{k}", f"B{k - warmup}"]
    return order + [f"B{k}" for k in range(micro_batches - warmup, micro_batches)]
