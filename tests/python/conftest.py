"""Shared by the Python test files."""
import pytest


@pytest.fixture
def op_recording_backend():
    """(backend, ops): a torch.compile backend that records the call_function targets of the
    forward and backward graphs AOTAutograd makes (to see which custom ops a traced function
    calls), and runs them eagerly."""
    ops = []

    def backend(graph, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

        def compiler(g, _):
            ops.extend(str(n.target) for n in g.graph.nodes if n.op == "call_function")
            return make_boxed_func(g.forward)
        return aot_module_simplified(graph, example_inputs, fw_compiler=compiler, bw_compiler=compiler)
    return backend, ops
