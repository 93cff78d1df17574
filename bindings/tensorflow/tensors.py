"""The collectives on TensorFlow tensors and variables, with horovod.tensorflow's signatures,
eagerly, inside tf.function and in tf.compat.v1 graphs.

Eagerly, a tensor reaches the core as `tensor.numpy()`. In a graph the call becomes one stateful
`tf.numpy_function` node with the static shape set on its outputs, so graphs keep their shapes.
Each such node runs after the graph's previous collective node (a control dependency), so every
rank runs them in program order even where nothing else orders them (a tf.compat.v1 graph, whose
inter-op threads would otherwise block in different collectives on different ranks). A
collective without a name inside a graph is named after its input tensor, which is the same on
every rank that builds the same graph.

The dense collectives are differentiable (tf.custom_gradient), as Horovod's are, by Horovod's
rules (ringreduce.training.gradients), as in ringreduce.torch.

`device_dense` and `device_sparse` are accepted: the engine runs the collectives where their
arrays live. Names are never prefixed by the name scope, so `ignore_name_scope` changes nothing.
"""

import contextlib
import weakref
from collections.abc import Sequence
from typing import TypeAlias

import numpy as np

import ringreduce as core
import tensorflow as tf
from ringreduce import ops, process_sets
from ringreduce.collectives import grouped_names
from ringreduce.numerics import compression as compressors
from ringreduce.numerics.compression import CompressorLike
from ringreduce.ops import ReduceOp
from ringreduce.process_sets import ProcessSet, global_process_set
from ringreduce.tensorflow import graph_errors
from ringreduce.tensorflow.compression import Compression, in_engine
from ringreduce.training import gradients

# What the collectives take: a tensor, a variable, tf.IndexedSlices for allreduce, or anything
# tf.convert_to_tensor takes.
TensorLike: TypeAlias = tf.types.experimental.TensorLike | tf.Variable | tf.IndexedSlices

# Each graph's latest collective node.
_last_collective: weakref.WeakKeyDictionary[tf.Graph, tf.Operation] = weakref.WeakKeyDictionary()


def allreduce(tensor: TensorLike, average: bool | None = None, device_dense: str = "", device_sparse: str = "",
              compression: CompressorLike = Compression.none, op: ReduceOp | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, name: str | None = None, process_set: ProcessSet = global_process_set,
              ignore_name_scope: bool = False) -> tf.Tensor | tf.IndexedSlices:
    """Combine `tensor` over every rank of `process_set` (Average by default). A tf.IndexedSlices
    is gathered instead (its values and indices), Average dividing the values by the size, as
    Horovod."""
    return _combined([tensor], ops.from_average(op, average), compression, prescale_factor, postscale_factor, name,
                     process_set, grouped=False)[0]


def grouped_allreduce(tensors: Sequence[TensorLike], average: bool | None = None, device_dense: str = "",
                      device_sparse: str = "", compression: CompressorLike = Compression.none,
                      op: ReduceOp | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                      name: str | None = None) -> list[tf.Tensor | tf.IndexedSlices]:
    """allreduce of several tensors submitted together, so that they fuse; one graph node."""
    return _combined(list(tensors), ops.from_average(op, average), compression, prescale_factor, postscale_factor,
                     name, process_set, grouped=True)


def _combined(tensors, op, compression, prescale_factor, postscale_factor, name, process_set, grouped):
    """Dense tensors allreduced (as one group, or one alone under `name` itself), tf.IndexedSlices
    gathered."""
    sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
    dense = [i for i in range(len(tensors)) if i not in sparse]
    results = [None] * len(tensors)
    if sparse:
        gathered = _gathered_slices([tensors[i] for i in sparse], op, prescale_factor, postscale_factor, name,
                                    process_set)
        for index, result in zip(sparse, gathered, strict=True):
            results[index] = result
    if dense and getattr(compression, "gathers", False):  # top-k: sparse on the wire, gathered; vectors whole
        names = grouped_names(name, len(dense)) if grouped else [name]
        packed = compressors.compress_all(compression, [_value(tensors[i]) for i in dense], names)
        sparsified = [k for k, (sent, _) in enumerate(packed) if isinstance(sent, tf.IndexedSlices)]
        whole = [k for k in range(len(packed)) if k not in sparsified]
        combined = [None] * len(packed)
        if sparsified:
            gathered = _gathered_slices([packed[k][0] for k in sparsified], op, prescale_factor, postscale_factor,
                                        name, process_set)
            for k, slices in zip(sparsified, gathered, strict=True):
                combined[k] = slices
        if whole:
            averaged = _combined([packed[k][0] for k in whole], op, Compression.none, prescale_factor,
                                 postscale_factor, None if name is None else f"{name}.whole", process_set, grouped)
            for k, tensor in zip(whole, averaged, strict=True):
                combined[k] = tensor
        for index, sent, (_, ctx) in zip(dense, combined, packed, strict=True):
            results[index] = compression.decompress(sent, ctx)
    elif dense:
        values = [_value(tensors[i]) for i in dense]

        def collective(arrays, engine, base):
            scaling = dict(op=op, prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                           compression=engine, process_set=process_set)
            if grouped:
                return core.grouped_allreduce(tensors=arrays, name=base, **scaling)
            return [core.allreduce(tensor=arrays[0], name=base, **scaling)]

        def backward(upstream):
            gradients.check_differentiable(op, "allreduce")
            return _combined(upstream, op, Compression.none, prescale_factor, postscale_factor, None, process_set,
                             grouped)

        names = grouped_names(name, len(values)) if grouped else [name]
        reduced = _differentiable(lambda ts: _compressed(compression, ts, names, lambda ts, engine: run_on_values(
            "allreduce", name, ts, lambda arrays, base: collective(arrays, engine, base), same_shapes(ts))),
            backward, values)
        for index, result in zip(dense, reduced, strict=True):
            results[index] = result
    return results


def allgather(tensor: TensorLike, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """Every rank's tensor concatenated along the first dimension (which may differ by rank), in
    the order of `process_set`'s ranks."""
    return grouped_allgather([tensor], name, ignore_name_scope, process_set)[0]


def grouped_allgather(tensors: Sequence[TensorLike], name: str | None = None, ignore_name_scope: bool = False,
                      process_set: ProcessSet = global_process_set) -> list[tf.Tensor]:
    values = [_value(t) for t in tensors]

    def backward(upstream):
        """This rank's rows of the gradient averaged over the ranks."""
        averaged = _combined(upstream, gradients.GATHERED_GRADIENT_OP, Compression.none, 1.0, 1.0, None, process_set,
                             grouped=True)
        every_ranks_rows = grouped_allgather([tf.shape(v, out_type=tf.int64)[:1] for v in values],
                                             process_set=process_set)
        mine = process_set.rank()
        return [tf.slice(s, tf.concat([[tf.reduce_sum(rows[:mine])], tf.zeros_like(tf.shape(v)[1:], dtype=tf.int64)],
                                      0), tf.shape(v, out_type=tf.int64))
                for s, rows, v in zip(averaged, every_ranks_rows, values, strict=True)]

    return _differentiable(lambda ts: run_on_values("allgather", name, ts, lambda arrays, base: core.grouped_allgather(
        tensors=arrays, name=base, process_set=process_set), _rows_unknown(ts)), backward, values)


def broadcast(tensor: TensorLike, root_rank: int, name: str | None = None, ignore_name_scope: bool = False,
              process_set: ProcessSet = global_process_set) -> tf.Tensor:
    """The root rank's tensor (root_rank is a global rank), on every rank of `process_set`."""
    def backward(upstream):
        averaged = allreduce(upstream[0], op=gradients.GATHERED_GRADIENT_OP, process_set=process_set)
        return [averaged if core.rank() == root_rank else averaged * 0]  # a value of it: the allreduce runs

    return _differentiable(lambda ts: run_on_values(
        "broadcast", name, ts, lambda arrays, base: [core.broadcast(tensor=arrays[0], root_rank=root_rank, name=base,
                                                                    process_set=process_set)],
        same_shapes(ts)), backward, [_value(tensor)])[0]


def broadcast_(variables: Sequence[tf.Variable], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list:
    """Assign the root rank's values to every rank's variables; returns the updated variables
    (in a graph, their values after the assignment, which running them makes)."""
    return [variable.assign(broadcast(variable, root_rank, None if name is None else f"{name}.{index}",
                                      process_set=process_set))
            for index, variable in enumerate(list(variables))]


def alltoall(tensor: TensorLike, splits: TensorLike | None = None, name: str | None = None,
             ignore_name_scope: bool = False,
             process_set: ProcessSet = global_process_set) -> tf.Tensor | tuple[tf.Tensor, tf.Tensor]:
    """Block j of the first dimension to rank j (of `process_set`); without `splits` it is divided
    equally. With `splits` the result is (tensor, rows received from each rank), as Horovod."""
    given = splits is not None
    inputs = [_value(tensor)] + ([tf.cast(tf.convert_to_tensor(splits), tf.int64)] if given else [])

    def collective(arrays, base):
        result, received = core.alltoall(tensor=arrays[0], splits=arrays[1].tolist() if given else None, name=base,
                                         process_set=process_set, return_splits=True)
        return [result, np.asarray(received, dtype=np.int64)]

    exchanged: list[tf.Tensor] = []

    def forward(ts):
        # The splits travel as a graph input (a second numpy_function input); the rows received
        # come back as a second output, which the gradient sends back by.
        exchanged[:] = run_on_values("alltoall", name, ts + inputs[1:], collective,
                                     _rows_unknown(ts) + [tf.TensorShape([process_set.size()])],
                                     dtypes=[ts[0].dtype, tf.int64])
        return exchanged[:1]

    (result,) = _differentiable(forward, lambda upstream: [
        alltoall(upstream[0], splits=exchanged[1], process_set=process_set)[0]], inputs[:1])
    return (result, exchanged[1]) if given else result


def reducescatter(tensor: TensorLike, device_dense: str = "", compression: CompressorLike = Compression.none,
                  op: ReduceOp = core.Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set, ignore_name_scope: bool = False,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> tf.Tensor:
    """Combine every rank's tensor; this rank keeps its share of the first dimension (the first
    ranks one row more where it does not divide evenly)."""
    return _grouped_reducescatter([tensor], compression, op, prescale_factor, postscale_factor, name, process_set)[0]


def grouped_reducescatter(tensors: Sequence[TensorLike], device_dense: str = "",
                          compression: CompressorLike = Compression.none, op: ReduceOp = core.Average,
                          process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[tf.Tensor]:
    return _grouped_reducescatter(tensors, compression, op, prescale_factor, postscale_factor, None, process_set)


def size_op(process_set_id: int = 0, name: str | None = None) -> tf.Tensor:
    """The number of ranks of a process set (by its id; 0, the whole job), as a tensor."""
    return tf.constant(process_sets.by_id(process_set_id).size(), dtype=tf.int32, name=name)


def local_size_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(core.local_size(), dtype=tf.int32, name=name)


def rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(core.rank(), dtype=tf.int32, name=name)


def local_rank_op(name: str | None = None) -> tf.Tensor:
    return tf.constant(core.local_rank(), dtype=tf.int32, name=name)


def _grouped_reducescatter(tensors, compression, op, prescale_factor, postscale_factor, name, process_set):
    values = [_value(t) for t in tensors]

    def collective(arrays, base):
        return core.grouped_reducescatter(tensors=arrays, op=op, name=base, prescale_factor=prescale_factor,
                                          postscale_factor=postscale_factor, process_set=process_set)

    def forward(ts):
        if in_engine(compression) is compressors.Compression.none:
            return run_on_values("reducescatter", name, ts, collective, _rows_unknown(ts))
        packed = compressors.compress_all(compression, ts, grouped_names(name, len(ts)))  # the engine's has no cast
        reduced = run_on_values("reducescatter", name, [t for t, _ in packed], collective, _rows_unknown(ts))
        return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, packed, strict=True)]

    def backward(upstream):
        scale = gradients.reducescatter_scale(op, prescale_factor, postscale_factor, process_set.size())
        return [g * tf.cast(scale, g.dtype) for g in grouped_allgather(upstream, process_set=process_set)]

    return _differentiable(forward, backward, values)


def _gathered_slices(slices, op, prescale_factor, postscale_factor, name, process_set):
    """tf.IndexedSlices combined over ranks as Horovod does: every rank's values and indices
    gathered (the same index may then appear several times; applying them adds them up)."""
    if op not in (core.Sum, core.Average):
        raise NotImplementedError(f"{ops.ReduceOp(op).name.capitalize()} does not combine tf.IndexedSlices: only Sum "
                                  "and Average do (as in Horovod)")
    if prescale_factor != 1.0 or postscale_factor != 1.0:
        raise NotImplementedError("prescale_factor and postscale_factor do not apply to tf.IndexedSlices")
    gathered = grouped_allgather([s.values for s in slices] + [s.indices for s in slices],
                                 name=None if name is None else f"{name}.slices", process_set=process_set)
    values, indices = gathered[:len(slices)], gathered[len(slices):]
    if op == core.Average:
        values = [v / tf.cast(process_set.size(), v.dtype) for v in values]
    return [tf.IndexedSlices(v, i, dense_shape=s.dense_shape) for v, i, s in zip(values, indices, slices, strict=True)]


def _differentiable(forward, backward, values):
    """forward(tensors) -> tensors, with backward(gradients of the outputs) -> gradients of the
    inputs as its gradient."""
    @tf.custom_gradient
    def run(*inputs):
        outputs = forward(list(inputs))

        def gradient(*upstream):
            return backward([tf.zeros_like(o) if u is None else u for u, o in zip(upstream, outputs, strict=True)])

        return outputs, gradient

    return run(*values)


def _compressed(compression, values, names, run):
    """run(tensors, engine compression): the built-ins are the engine's own; a compressor of the
    user's own compresses before the collective and decompresses after (given each tensor's name
    where it keeps state per tensor)."""
    engine = in_engine(compression)
    if engine is not None:
        return run(values, engine)
    packed = compressors.compress_all(compression, values, names)
    results = run([t for t, _ in packed], compressors.Compression.none)
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(results, packed, strict=True)]


def run_on_values(kind, name, values, collective, shapes, dtypes=None):
    """collective(arrays, name) -> arrays, on the tensors' values: eagerly, or as one graph node
    (named after the first input where no name is given) that runs after the graph's previous
    collective node. The outputs have the inputs' dtypes unless `dtypes` says otherwise. Eagerly
    a ringreduce error is raised as TensorFlow's ops raise theirs too."""
    if tf.executing_eagerly():
        with raised_as_tensorflow_errors():
            results = collective([v.numpy() for v in values], name)
        return [tf.convert_to_tensor(np.asarray(r)) for r in results]
    name = name or f"{kind}.{values[0].name}"
    dtypes = dtypes or [v.dtype for v in values]
    graph = tf.compat.v1.get_default_graph()
    previous = _last_collective.get(graph)
    with tf.control_dependencies([previous] if previous is not None else []):
        def run(*arrays):  # the results, then the status code and message the next node fails with
            try:
                return [*(np.asarray(r) for r in collective(list(arrays), name)), np.int32(0), b""]
            except (core.RingReduceError, ValueError, TypeError) as error:
                unused = [np.zeros(0, d.as_numpy_dtype) for d in dtypes]
                return [*unused, np.int32(graph_errors.status_code(error)), str(error).encode()]

        *results, code, message = tf.numpy_function(run, values, [*dtypes, tf.int32, tf.string], stateful=True)
        results = graph_errors.raise_if(results, code, message)
    results = results if isinstance(results, list) else [results]
    _last_collective[graph] = results[0].op
    for result, shape in zip(results, shapes, strict=True):
        result.set_shape(shape)
    return results


def same_shapes(values):
    return [v.shape for v in values]


def _rows_unknown(values):
    return [tf.TensorShape([None]).concatenate(v.shape[1:]) if v.shape.rank is not None else tf.TensorShape(None)
            for v in values]


def _value(tensor):
    """A tf.Tensor for a tensor, a variable or anything convertible."""
    if isinstance(tensor, tf.Variable):
        return tensor.read_value() if not tf.executing_eagerly() else tf.convert_to_tensor(tensor)
    return tf.convert_to_tensor(tensor)


_ERROR_CLASSES: dict[type[BaseException], type[BaseException]] = {}


@contextlib.contextmanager
def raised_as_tensorflow_errors():
    """A ringreduce error raised as a class that is both its own and the TensorFlow op error
    Horovod's ops raise (graph_errors.op_error_class), so that `except
    tf.errors.FailedPreconditionError` catches a mismatch, as it catches Horovod's, and so does
    `except rr.MismatchError`."""
    try:
        yield
    except (core.RingReduceError, ValueError, TypeError) as error:
        if isinstance(error, tf.errors.OpError):
            raise
        kind = _ERROR_CLASSES.get(type(error))
        if kind is None:
            base = graph_errors.op_error_class(error)
            kind = _ERROR_CLASSES[type(error)] = type(type(error).__name__, (type(error), base),
                                                      {"__init__": base.__init__, "__str__": base.__str__,
                                                       "__module__": type(error).__module__})
        raise kind(None, None, str(error)) from error
