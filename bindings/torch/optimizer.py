"""DistributedOptimizer: wraps a torch.optim optimizer so that every gradient is averaged over
the ranks, starting as soon as backward has produced it, so communication overlaps the rest
of the backward pass; step() only waits for what is still in flight.
"""

import contextlib
import warnings
from collections.abc import Iterable

import ringreduce as core
import torch
from ringreduce.numerics import compression as compressors
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.torch import tensors
from ringreduce.torch.compression import Compression, in_engine
from ringreduce.training import options, presence
from ringreduce.training.load_balancing import LoadBalancer
from ringreduce.training.powersgd import PowerSGD
from torch.amp.grad_scaler import OptState

_PRESENCE_NAME = "ringreduce.torch.gradients_present"


class _DistributedOptimizer:
    """The methods mixed in before the wrapped optimizer's own class (zero-argument super() calls
    reach that class, and still do from a user's subclass of the result)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set, staleness, weight_prediction,
                 load_balancer):
        super().__init__(params)
        self._process_set = process_set
        self._powersgd = compression if isinstance(compression, PowerSGD) else None
        self._staleness = staleness
        # With staleness: parameter -> (handle or None once arrived, gradient) of the last step's
        # allreduce, in place in the gradient tensor that step's backward made.
        self._in_flight = {}
        self._stale_ready = False  # whether the last synchronize() put an average into the gradients
        # With weight prediction: parameter -> (its true value, its _version once the prediction was
        # written: a later in-place write, a loaded checkpoint or a broadcast, makes that the true value).
        self._true_weights = {} if staleness and weight_prediction else None
        self._scratches = {}  # (dtype, device) -> a flat buffer as large as the largest such parameter
        self._balancer = load_balancer
        self._compression = Compression.none if self._powersgd is not None else compression
        self._engine_compression = in_engine(self._compression)
        self._sparse_as_dense = sparse_as_dense
        self._op = op
        self._passes_per_step = backward_passes_per_step
        self._prescale, self._postscale = 1.0 / gradient_predivide_factor, gradient_predivide_factor
        self._parameter_names = _parameter_names(self.param_groups, named_parameters)  # Horovod's attribute
        # A rank outside the process set trains alone, as under Horovod: no hooks, no averaging.
        self._ordered = [p for group in self.param_groups for p in group["params"] if p.requires_grad
                         and process_set.included()]
        self._handles = {}  # parameter -> handle of its gradient's allreduce, this step
        self._passes = {p: 0 for p in self._ordered}
        self._synchronized = False
        self._skip_synchronize = False
        for parameter in self._ordered:
            parameter.register_post_accumulate_grad_hook(self._gradient_ready)

    def _gradient_ready(self, parameter):
        """Called by autograd once `parameter.grad` holds this backward pass's gradient."""
        if parameter in self._handles:
            raise RuntimeError(
                f"the gradient of {self._parameter_names[parameter]!r} was computed again before step() or "
                "synchronize(); call backward once per step, or raise backward_passes_per_step")
        self._passes[parameter] += 1
        if self._passes[parameter] == self._passes_per_step and self._powersgd is None:
            self._handles[parameter] = self._allreduce(parameter)

    def _allreduce(self, parameter):
        """Start averaging `parameter.grad` in place (with staleness, once the last step's average of
        that parameter has arrived: one request per name in flight): the engine casts for the
        built-in compressions, a compressor of the user's own runs around the allreduce; a sparse
        gradient is gathered (indices and values, as Horovod), unless sparse_as_dense makes it dense
        first."""
        name = self._request_name(parameter)
        if self._staleness:
            self._last_step_arrived(parameter)
        if self._balancer is not None:
            parameter.grad.mul_(self._balancer.weight())
        if parameter.grad.is_sparse:
            if not self._sparse_as_dense:
                if self._staleness:
                    raise ValueError(f"staleness=1 needs dense gradients; {name!r} is sparse (sparse_as_dense=True)")
                return tensors.SparseAllreduce(parameter.grad, name, self._op, self._process_set,
                                        lambda combined: setattr(parameter, "grad", combined))
            parameter.grad = parameter.grad.to_dense()
        target = parameter.grad
        if self._engine_compression is not None:
            return tensors.engine_allreduce_async_(target, self._op, name, self._prescale, self._postscale,
                                                   self._engine_compression, self._process_set)
        compressed, ctx = compressors.compress(self._compression, target, name)
        if getattr(self._compression, "gathers", False) and compressed.is_sparse:  # top-k; its vectors are dense
            return tensors.SparseAllreduce(compressed, name, self._op, self._process_set,
                                    lambda combined: target.copy_(self._compression.decompress(combined, ctx)))
        handle = tensors.engine_allreduce_async(compressed, self._op, name, self._prescale, self._postscale,
                                                process_set=self._process_set)
        return tensors.Handle(handle, lambda result: target.copy_(self._compression.decompress(result, ctx)))

    def _request_name(self, parameter):
        """The name of the collectives on `parameter`'s gradient (apart from the user's own names)."""
        return f"grad.{self._parameter_names[parameter]}"

    def _last_step_arrived(self, parameter):
        """Wait for the last step's average of `parameter` (asked one step later: long done); it is
        applied at this step's step()."""
        handle, gradient = self._in_flight.get(parameter, (None, None))
        if handle is not None:
            handle.wait()
            self._in_flight[parameter] = (None, gradient)

    def synchronize(self):
        """Wait until every gradient of this step is averaged over the ranks (with staleness=1:
        every gradient of the last step, whose averages become the gradients; this step's go on in
        the background).

        A parameter that got no gradient here but did on another rank takes part with zeros,
        so no rank waits for it; one that got no gradient anywhere keeps grad None
        (ringreduce.training.presence, the rule of both bindings).
        """
        if not self._process_set.included():
            self._synchronized = True
            return
        if self._balancer is not None:
            self._balancer.work_done()
        kinds = [self._kind(p) for p in self._ordered]
        plan = presence.stand_ins(kinds, [self._parameter_names[p] for p in self._ordered], _PRESENCE_NAME,
                                  self._process_set)
        if self._powersgd is not None:
            self._average_low_rank(kinds, plan)
            return
        for parameter, kind, stand_in in zip(self._ordered, kinds, plan, strict=True):
            if stand_in != presence.MISSING and kind == presence.MISSING:
                parameter.grad = _stand_in(stand_in, parameter)
                self._handles[parameter] = self._allreduce(parameter)
            elif stand_in != presence.MISSING and parameter not in self._handles:  # fewer passes than per step here
                self._handles[parameter] = self._allreduce(parameter)
        if self._staleness:
            self._take_last_steps_averages()
            if self._true_weights is not None:
                self._restore_true_weights()
        else:
            for handle in self._handles.values():
                handle.wait()
            self._handles.clear()
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = True

    def _take_last_steps_averages(self):
        """staleness=1: the last step's averages become the gradients; this step's stay in flight,
        in the gradient tensors its backward made, until the next step needs them."""
        last = self._in_flight
        self._in_flight = {parameter: (handle, parameter.grad) for parameter, handle in self._handles.items()}
        self._handles = {}
        for parameter in self._ordered:
            handle, gradient = last.get(parameter, (None, None))
            if handle is not None:
                handle.wait()
            parameter.grad = gradient
        self._stale_ready = bool(last)

    def _restore_true_weights(self):
        """The parameters back from where the last step() predicted them to where they are."""
        with torch.no_grad():
            for parameter in self._ordered:
                true, version = self._true_weights.get(parameter, (None, None))
                if true is None or parameter._version != version:
                    self._true_weights[parameter] = (parameter.detach().clone(), None)
                else:
                    parameter.copy_(true)

    def _predict_weights(self):
        """Move each parameter one more update ahead (w + (w - w_before)), keeping w: the next
        backward's gradient is applied one step later, when the weights have moved about that far."""
        with torch.no_grad():
            for parameter in self._ordered:
                before, _ = self._true_weights[parameter]
                predicted = self._scratch(parameter)
                torch.lerp(before, parameter, 2.0, out=predicted)
                before.copy_(parameter)
                parameter.copy_(predicted)
                self._true_weights[parameter] = (before, parameter._version)

    def _scratch(self, parameter):
        """A buffer the shape of `parameter`, reused by every parameter of its dtype and device: a
        fresh one per parameter and step costs its page faults on the CPU (6 ms against 3.5 ms for
        3 M floats)."""
        key = (parameter.dtype, parameter.device)
        flat = self._scratches.get(key)
        if flat is None or flat.numel() < parameter.numel():
            flat = self._scratches[key] = torch.empty(parameter.numel(), dtype=parameter.dtype,
                                                      device=parameter.device)
        return flat[:parameter.numel()].view_as(parameter)

    def _kind(self, parameter):
        """What this rank has of `parameter`'s gradient this step (ringreduce.training.presence)."""
        if parameter not in self._handles and (parameter.grad is None or self._passes[parameter] == 0):
            return presence.MISSING
        sparse = parameter.grad.is_sparse and not self._sparse_as_dense
        return presence.SPARSE if sparse else presence.DENSE

    def _average_low_rank(self, kinds, plan):
        """PowerSGD's averaging of every gradient of the step at once (its factors travel fused,
        so it waits for backward to end: no overlap with it)."""
        named, copies = {}, []
        for parameter, kind, stand_in in zip(self._ordered, kinds, plan, strict=True):
            if stand_in != presence.MISSING:
                if kind == presence.MISSING:
                    parameter.grad = _stand_in(stand_in, parameter)
                if parameter.grad.is_sparse:
                    raise ValueError(f"PowerSGD needs dense gradients; {self._parameter_names[parameter]!r} is sparse")
                if self._balancer is not None:
                    parameter.grad.mul_(self._balancer.weight())
                array = named[self._request_name(parameter)] = tensors.as_array(parameter.grad)
                if parameter.grad.dtype == torch.bfloat16:  # as_array's float32 copy: averaged there
                    copies.append((parameter.grad, array))
        self._powersgd.average(named, self._process_set)
        for grad, array in copies:
            grad.copy_(tensors.as_tensor(array, grad))
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = True

    def compression_state_dict(self):
        """The compressor's state (error-feedback residuals, PowerSGD's), None where it keeps none.
        It differs per rank: rr.checkpoint keeps it per rank."""
        compressor = self._powersgd or self._compression
        return compressor.state_dict() if callable(getattr(compressor, "state_dict", None)) else None

    def load_compression_state_dict(self, state):
        """Load what compression_state_dict gave (None: nothing, the compressor stays as it is)."""
        if state is not None:
            (self._powersgd or self._compression).load_state_dict(state)

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For `synchronize()` by hand before step(), e.g. to clip the averaged gradients."""
        self._skip_synchronize = True
        try:
            yield
        finally:
            self._skip_synchronize = False

    # GradScaler.step(optimizer) then calls step(grad_scaler=scaler) instead of unscaling first.
    _step_supports_amp_scaling = True

    def step(self, closure=None, grad_scaler=None):
        if grad_scaler is not None:
            return self._step_scaled(closure, grad_scaler)
        if not self._skip_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() after "
                              "optimizer.synchronize(): the gradients are averaged once more; call step() "
                              "inside `with optimizer.skip_synchronize():` after a synchronize() of your own",
                              stacklevel=2)
            self.synchronize()
        elif not self._synchronized:
            raise RuntimeError("step() inside skip_synchronize() needs a synchronize() call before it")
        self._synchronized = False
        if not self._staleness:
            result = super().step(closure)
        else:
            result = super().step(closure) if self._stale_ready else None  # the first step has no average yet
            for parameter in self._ordered:  # spent; the next backward makes new ones
                parameter.grad = None
            if self._true_weights is not None:
                self._predict_weights()
        if self._balancer is not None:
            self._balancer.step_done()
        return result

    def _step_scaled(self, closure, scaler):
        """scaler.step(optimizer): the scaled gradients are averaged first (unless the program did,
        in Horovod's pattern: synchronize(), unscale_, clip, skip_synchronize()), then unscaled,
        so that every rank finds them finite or not alike and steps or skips alike (each rank's
        own check, on its own gradients in flight, would train the replicas apart)."""
        if not self._skip_synchronize:
            self.synchronize()
        elif not self._synchronized:
            raise RuntimeError("scaler.step() inside skip_synchronize() needs a synchronize() call before it")
        state = scaler._per_optimizer_states[id(self)]
        if state["stage"] is OptState.READY:
            scaler.unscale_(self)
        if any(found.item() for found in state["found_inf_per_device"].values()):
            self._synchronized = False
            return None  # on every rank: the average is not finite anywhere
        with self.skip_synchronize():
            return self.step(closure)

    def load_state_dict(self, state_dict):
        """The wrapped optimizer's state_dict; averages still in flight (a step cut short, as when a
        rank of the job failed) are dropped: the loaded state is where training goes on from."""
        self._handles, self._in_flight = {}, {}
        self._passes = dict.fromkeys(self._passes, 0)
        super().load_state_dict(state_dict)

    def zero_grad(self, set_to_none=True):
        if self._handles:
            raise RuntimeError("zero_grad() was called after backward() but before step() or synchronize(): "
                               "the gradients are still being averaged")
        return super().zero_grad(set_to_none=set_to_none)


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: CompressorLike = Compression.none, backward_passes_per_step: int = 1,
                         op: ReduceOp = core.Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: int | list[list[torch.Tensor]] | None = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set, staleness: int = 0,
                         weight_prediction: bool = True,
                         load_balancer: LoadBalancer | None = None) -> torch.optim.Optimizer:
    """`optimizer`, averaging gradients over the ranks of `process_set` (all of them by default).
    The result is an instance of a subclass of the optimizer's own class, so param_groups,
    state_dict, load_state_dict and LR schedulers behave as they do on the original; its state (a
    loaded checkpoint) comes along.

    `num_groups` and `groups` are Horovod's way to fuse gradients into grouped allreduces; the
    engine fuses every gradient that is ready in a cycle anyway, so they are checked and need
    nothing more.

    `staleness=1` (ringreduce's) averages each step's gradients while the next step computes: the
    update of step t applies the average of step t-1's gradients (the same on every rank, so the
    replicas stay identical); the first step() applies nothing, and the gradients are None after
    each step(). With `weight_prediction` (the default), step() leaves the parameters one more
    update ahead (w + (w - w_before)), where the weights will be when the next backward's gradient
    is applied; the next synchronize() (in step(), or by hand after the last step) puts the true
    weights back. Without it, momentum 0.9 makes the one-step delay oscillate early in training.

    `load_balancer` (ringreduce's: a `LoadBalancer`, whose `BalancedBatchSampler` gives the
    batches) weights each rank's gradients by its share of the step's batch, so that the average is
    the batch's mean however it was split, and tells it how long this rank computed."""
    options.check(op, compression, gradient_predivide_factor, backward_passes_per_step, staleness, load_balancer,
                  process_set)
    options.groups(num_groups, groups, lambda member: isinstance(member, torch.Tensor), "torch.Tensor")
    cls = type(optimizer.__class__.__name__, (_DistributedOptimizer, optimizer.__class__), {})
    distributed = cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
                      gradient_predivide_factor, sparse_as_dense, process_set, staleness, weight_prediction,
                      load_balancer)
    distributed.load_state_dict(optimizer.state_dict())
    return distributed


def _parameter_names(param_groups, named_parameters):
    """A name per parameter, the same on every rank: given ones, else Horovod's from the position
    in the groups."""
    parameters = [p for group in param_groups for p in group["params"]]
    if named_parameters is None:
        return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(param_groups)
                for j, p in enumerate(group["params"])}
    named = list(named_parameters)
    names = [name for name, _ in named]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"named_parameters has duplicate names: {', '.join(duplicates)}")
    by_parameter = {p: name for name, p in named}
    missing = [i for i, p in enumerate(parameters) if p not in by_parameter]
    if missing:
        raise ValueError(f"named_parameters does not name {len(missing)} of the optimizer's parameters "
                         f"(positions {missing[:10]} in its param_groups); pass model.named_parameters() "
                         "for the model the optimizer was built on")
    return {p: by_parameter[p] for p in parameters}


def _stand_in(kind, parameter):
    """Zeros for a gradient this rank lacks, as the other ranks have it: dense, or sparse with no
    rows (an embedding's gradient, the one sparse gradient torch makes, indexes its rows)."""
    if kind == presence.SPARSE:
        return torch.sparse_coo_tensor(torch.empty((1, 0), dtype=torch.long, device=parameter.device),
                                       torch.empty((0, *parameter.shape[1:]), dtype=parameter.dtype,
                                                   device=parameter.device), parameter.shape)
    return torch.zeros_like(parameter)
