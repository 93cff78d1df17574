"""How a collective inside a TensorFlow graph fails: with the status code its Python node returned
(through the compiled op of bindings/tensorflow/graph_errors.cc), without a compiler still naming
the problem, and never with an op taken from a directory someone else could write."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")



def test_a_graph_collective_fails_with_the_status_code_its_python_node_returned():
    from ringreduce.tensorflow import graph_errors

    @tf.function
    def checked(code):
        return graph_errors.raise_if([tf.constant([1.0, 2.0])], code, tf.constant("ranks 0 and 1 disagree"))

    np.testing.assert_array_equal(checked(tf.constant(0))[0], [1.0, 2.0])
    with pytest.raises(tf.errors.FailedPreconditionError, match="ranks 0 and 1 disagree"):
        checked(tf.constant(tf.errors.FAILED_PRECONDITION))
    with pytest.raises(tf.errors.InvalidArgumentError, match="ranks 0 and 1 disagree"):
        checked(tf.constant(tf.errors.INVALID_ARGUMENT))


def test_without_a_compiler_a_graph_collective_still_fails_naming_the_problem(monkeypatch):
    from ringreduce.tensorflow import graph_errors

    monkeypatch.setattr(graph_errors, "_compiled_op", lambda: None)

    @tf.function
    def checked(code):
        return graph_errors.raise_if([tf.constant([1.0])], code, tf.constant("ranks 0 and 1 disagree"))

    np.testing.assert_array_equal(checked(tf.constant(0))[0], [1.0])
    with pytest.raises(tf.errors.UnknownError, match="ranks 0 and 1 disagree"):
        checked(tf.constant(tf.errors.FAILED_PRECONDITION))


@pytest.mark.parametrize("planted", ["writable by others", "a link"])
def test_the_compiled_op_is_never_taken_from_a_directory_someone_else_could_write(tmp_path, planted):
    from ringreduce.tensorflow import graph_errors

    target = tmp_path / "ops"
    if planted == "a link":
        (tmp_path / "elsewhere").mkdir()
        target.symlink_to(tmp_path / "elsewhere")
    else:
        target.mkdir()
        target.chmod(0o777)
    with pytest.raises(PermissionError, match="not used"):
        graph_errors._private_directory(target)

