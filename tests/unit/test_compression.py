"""Compressors as pure logic (no MPI): the built-in casts, and error feedback's residual, which
must be exactly what the wire lost, on numpy arrays and torch tensors."""

import ml_dtypes
import numpy as np
import pytest

from ringreduce.numerics.compression import Compression, ErrorFeedback, TopK, bfloat16, compress, compress_all


def test_the_casts_travel_as_their_wire_dtype_and_come_back():
    x = np.array([1 / 3, 70000.0, -2.5], dtype=np.float32)
    with np.errstate(over="ignore"):  # 70000 is beyond float16: it becomes inf, as documented
        for compressor, wire in ((Compression.fp16, np.float16), (Compression.bf16, ml_dtypes.bfloat16)):
            sent, ctx = compressor.compress(x)
            assert sent.dtype == np.dtype(wire) and compressor.wire_dtype(np.float32) == np.dtype(wire)
            back = compressor.decompress(sent, ctx)
            assert back.dtype == np.float32
            np.testing.assert_array_equal(back, x.astype(wire).astype(np.float32))
        assert np.isinf(Compression.fp16.compress(x)[0][1]) and not np.isinf(Compression.bf16.compress(x)[0][1])
    ints = np.arange(4, dtype=np.int32)
    assert Compression.bf16.compress(ints)[0] is ints and Compression.bf16.wire_dtype(np.int32) == np.int32
    assert bfloat16().itemsize == 2


def test_a_bfloat16_wire_is_scaled_back_in_float64_with_the_factor_unrounded():
    """The cast back from a bfloat16 wire (with the average's 1/3) multiplies in float64, as for
    every dtype but float16 and float32: the float32 factor 1/3 gives other bits."""
    from ringreduce.numerics import reduction

    wire = np.arange(1, 4097, dtype=np.float32).astype(bfloat16())
    result = np.empty(wire.shape, np.float32)
    reduction.scale(wire, 1 / 3, out=result)
    np.testing.assert_array_equal(result, (wire.astype(np.float64) * (1 / 3)).astype(np.float32))
    assert not np.array_equal(result, wire.astype(np.float32) * np.float32(1 / 3))


def test_error_feedback_keeps_exactly_what_the_wire_lost_and_adds_it_to_the_next_step():
    rng = np.random.default_rng(0)
    feedback = ErrorFeedback(Compression.fp16)
    steps = [rng.standard_normal(64).astype(np.float32) / 3 for _ in range(3)]
    residual = np.zeros(64, np.float32)
    for gradient in steps:
        sent, ctx = compress(feedback, gradient, "w")
        corrected = gradient + residual
        np.testing.assert_array_equal(sent, corrected.astype(np.float16))
        residual = corrected - sent.astype(np.float32)
        np.testing.assert_array_equal(feedback.residuals["w"], residual)
        assert np.any(residual != 0)  # fp16 loses something on these values
        np.testing.assert_array_equal(feedback.decompress(sent, ctx), sent.astype(np.float32))
    # Over the steps, what went on the wire plus what is still kept is what was given: nothing is lost.
    fresh = ErrorFeedback(Compression.fp16)
    total_sent = sum(compress(fresh, g, "w")[0].astype(np.float64) for g in steps)
    np.testing.assert_allclose(total_sent + fresh.residuals["w"], np.sum(steps, axis=0, dtype=np.float64),
                               rtol=0, atol=1e-6)


def test_error_feedback_state_is_per_tensor_and_round_trips():
    feedback = ErrorFeedback(Compression.bf16)
    compress(feedback, np.full(3, 1 / 3, np.float32), "a")
    compress(feedback, np.full(2, 1 / 7, np.float32), "b")
    assert sorted(feedback.residuals) == ["a", "b"]
    restored = ErrorFeedback(Compression.bf16)
    restored.load_state_dict(feedback.state_dict())
    for name in ("a", "b"):
        np.testing.assert_array_equal(restored.residuals[name], feedback.residuals[name])


def test_error_feedback_on_torch_tensors():
    torch = pytest.importorskip("torch")
    from ringreduce.torch.compression import Compression as TorchCompression

    feedback = TorchCompression.error_feedback(TorchCompression.fp16)
    gradient = torch.full((5,), 1 / 3)
    sent, ctx = compress(feedback, gradient, "w")
    assert sent.dtype == torch.float16 and feedback.decompress(sent, ctx).dtype == torch.float32
    assert torch.equal(feedback.residuals["w"], gradient - sent.to(torch.float32))


def test_error_feedback_on_tensorflow_tensors():
    tf = pytest.importorskip("tensorflow")
    from ringreduce.tensorflow.compression import Compression as TFCompression

    feedback = TFCompression.error_feedback(TFCompression.bf16)
    gradient = tf.fill([5], 1 / 3)
    sent, ctx = compress(feedback, gradient, "w")
    assert sent.dtype == tf.bfloat16 and feedback.decompress(sent, ctx).dtype == tf.float32
    np.testing.assert_array_equal(feedback.residuals["w"].numpy(), (gradient - tf.cast(sent, tf.float32)).numpy())


def test_tensorflow_error_feedback_and_dgc_keep_their_state_inside_tf_function_as_eagerly():
    """The same three steps eagerly and in a tf.function (state in tf.Variables), against numpy."""
    tf = pytest.importorskip("tensorflow")
    from ringreduce.tensorflow.compression import Compression as TFCompression

    steps = [np.array([[1.0, -4.0], [2.0, 0.5]], np.float32), np.ones((2, 2), np.float32),
             np.full((2, 2), -0.5, np.float32)]
    for make, expected in ((lambda: TFCompression.error_feedback(TFCompression.topk(0.25)),
                            [[0, -4, 0, 0], [0, 0, 3, 0], [1.5, 0, 0, 0]]),
                           (lambda: TFCompression.dgc(ratio=0.25, momentum=0.5),
                            [[0, -4, 0, 0], [0, 0, 4, 0], [2.75, 0, 0, 0]])):
        eager, graph = make(), make()
        in_graph = tf.function(lambda g, c=graph: c.decompress(*c.compress(g, "w")))
        for step, want in zip(steps, expected, strict=True):
            np.testing.assert_allclose(eager.decompress(*eager.compress(tf.constant(step), "w")).numpy().ravel(), want)
            np.testing.assert_allclose(in_graph(tf.constant(step)).numpy().ravel(), want)
        for name, value in eager.state_dict().items():
            np.testing.assert_array_equal(value["w"], graph.state_dict()[name]["w"])
        restored = make()
        restored.load_state_dict(eager.state_dict())
        assert all(np.array_equal(v["w"], eager.state_dict()[k]["w"]) for k, v in restored.state_dict().items())


def test_a_compressor_with_state_per_tensor_needs_names():
    feedback = ErrorFeedback(Compression.fp16)
    with pytest.raises(ValueError, match="ErrorFeedback keeps state per tensor: give the call a name"):
        compress_all(feedback, [np.ones(2, np.float32)], [None])
    assert [c.dtype for c, _ in compress_all(Compression.fp16, [np.ones(2, np.float32)], [None])] == [np.float16]


def test_top_k_sends_at_least_one_entry_and_takes_a_ratio_in_range():
    assert [TopK(0.01).count(n) for n in (1, 50, 150, 3_145_728)] == [1, 1, 2, 31_457]
    assert TopK(1).count(7) == 7 and TopK().ratio == 0.01
    for ratio in (0, -0.1, 1.5):
        with pytest.raises(ValueError, match=rf"ratio must be in \(0, 1\], got {ratio}"):
            TopK(ratio)
    assert ErrorFeedback(TopK()).gathers and not ErrorFeedback(Compression.fp16).gathers


def test_dgc_sends_the_largest_accumulated_momentum_and_restarts_those_entries():
    torch = pytest.importorskip("torch")
    from ringreduce.torch.compression import Compression as TorchCompression

    def flat(tensor):
        return tensor.reshape(-1).tolist()

    dgc = TorchCompression.dgc(ratio=0.25, momentum=0.5)  # 1 of a 2 x 2 matrix's 4 entries travels
    sparse, shape = dgc.compress(torch.tensor([[1.0, -4.0], [2.0, 0.5]]), "w")
    assert flat(dgc.decompress(sparse, shape)) == [0.0, -4.0, 0.0, 0.0] and shape == (2, 2)
    assert flat(dgc.velocities["w"]) == flat(dgc.accumulated["w"]) == [1.0, 0.0, 2.0, 0.5]
    # u = 0.5 u + g = [1.5, 1, 2, 1.25]; v = v + u = [2.5, 1, 4, 1.75]: index 2 travels.
    sparse, shape = dgc.compress(torch.ones(2, 2), "w")
    assert flat(dgc.decompress(sparse, shape)) == [0.0, 0.0, 4.0, 0.0]
    assert flat(dgc.velocities["w"]) == [1.5, 1.0, 0.0, 1.25]
    assert flat(dgc.accumulated["w"]) == [2.5, 1.0, 0.0, 1.75]
    restored = TorchCompression.dgc(ratio=0.25, momentum=0.5)
    restored.load_state_dict(dgc.state_dict())
    assert flat(restored.accumulated["w"]) == [2.5, 1.0, 0.0, 1.75]


def test_top_k_and_dgc_send_a_vector_whole():
    """A bias travels as it is (top-k) or as its momentum u = momentum u + g (DGC), dense, with
    nothing accumulated or kept back: 1 % of a vector of a few dozen entries would hardly move it."""
    torch = pytest.importorskip("torch")
    from ringreduce.torch.compression import Compression as TorchCompression

    bias = torch.tensor([1.0, -4.0, 2.0, 0.5])
    sent, shape = TorchCompression.topk(0.25).compress(bias)
    assert sent is bias and not sent.is_sparse
    feedback = ErrorFeedback(TorchCompression.topk(0.25))
    assert feedback.decompress(*feedback.compress(bias, "b")).tolist() == bias.tolist()
    assert feedback.residuals["b"].tolist() == [0.0] * 4
    dgc = TorchCompression.dgc(ratio=0.25, momentum=0.5)
    assert dgc.decompress(*dgc.compress(bias, "b")).tolist() == [1.0, -4.0, 2.0, 0.5]
    assert dgc.decompress(*dgc.compress(torch.ones(4), "b")).tolist() == [1.5, -1.0, 2.0, 1.25]
    assert "b" not in dgc.accumulated


def test_tensorflow_top_k_and_dgc_send_a_vector_whole_eagerly_and_inside_tf_function():
    tf = pytest.importorskip("tensorflow")
    from ringreduce.tensorflow.compression import Compression as TFCompression

    bias = tf.constant([1.0, -4.0, 2.0, 0.5])
    sent, _ = TFCompression.topk(0.25).compress(bias)
    assert not isinstance(sent, tf.IndexedSlices) and sent is bias
    eager, graph = TFCompression.dgc(ratio=0.25, momentum=0.5), TFCompression.dgc(ratio=0.25, momentum=0.5)
    in_graph = tf.function(lambda g: graph.decompress(*graph.compress(g, "b")))
    for step, want in ((bias, [1.0, -4.0, 2.0, 0.5]), (tf.ones(4), [1.5, -1.0, 2.0, 1.25])):
        np.testing.assert_allclose(eager.decompress(*eager.compress(step, "b")).numpy(), want)
        np.testing.assert_allclose(in_graph(step).numpy(), want)
    assert "b" not in eager.accumulated and "b" not in graph.accumulated
