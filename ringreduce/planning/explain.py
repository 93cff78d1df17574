"""`rrun --explain`: a profile's parameters and the family the cost model gives each collective
at each size, in words."""

from ringreduce.algorithms import cost


def _bytes_text(n):
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n} B"


def explain(profile, shape, hierarchical=None):
    """The profile's parameters and the family the model gives each collective at each size, as
    `rrun --explain` and `rrun --calibrate` print them."""

    def rate(per_byte):
        return f"{1 / per_byte / 1e9:.2f} GB/s" if per_byte > 0 else "(hidden by the network)"

    def link(name, value):
        if value is None:
            return link(name, cost.ASSUMED_NETWORK) + " (assumed: measured on one host)"
        text = (f"  {name:9s} alpha {value.alpha * 1e6:.2f} us, {rate(value.beta.cache)} in cache, "
                f"{rate(value.beta.memory)} beyond")
        if value.exchange:
            text += f"; both ways at once {rate(value.exchange.cache)} and {rate(value.exchange.memory)}"
        if value.fresh:
            text += f"; {value.fresh * 1e9:.3f} ns a byte more for fresh data in a core's cache"
        if value.crowded_alpha is not None:
            text += f"; two ranks on one core: alpha {value.crowded_alpha * 1e6:.1f} us"
        return text

    def per_byte(name, value):
        return f"  {name:9s} {rate(value.cache)} in cache, {rate(value.memory)} from memory"

    lines = [f"cost model profile: {profile.source}",
             link("host", profile.host), link("network", profile.network), link("mpi", profile.mpi),
             per_byte("reduce", profile.combine), per_byte("copy", profile.copy),
             f"  barrier   {profile.barrier * 1e6:.2f} us"
             + (f"; {profile.shm_handover * 1e9:.3f} ns a byte more to read another core's writes"
                if profile.shm_handover else "") + f"; cache {_bytes_text(profile.cache_bytes)}"
             + (f", a core's {_bytes_text(profile.core_cache_bytes)}" if profile.core_cache_bytes else "") + "; "
             f"{profile.cores} cores per host",
             "  per call  " + ", ".join(f"{name} {seconds * 1e6:.1f} us" for name, seconds in profile.calls.items())]
    if shape.local > profile.cores:
        lines += [f"  crowded   {shape.local} ranks per host on {profile.cores} cores take turns on them: their "
                  "times can move 2-3x between runs, and a probe on fewer ranks predicts them short",
                  "            (docs/cost_model.md): calibrate on this layout (rrun --calibrate with the job's -np "
                  "and hosts), or run a rank per core"]
    lines.append(f"choice for {shape.ranks} ranks on {shape.hosts} host(s):")
    model = cost.Model(profile, shape)
    for collective in cost.COLLECTIVES:
        rows = model.table(collective, hierarchical)
        spans = [f"{family} from {_bytes_text(start)}" if start else family for start, family in rows]
        lines.append(f"  {collective:13s} " + ", ".join(spans))
    return "\n".join(lines)
