"""The search-level speed paths a runtime takes, as a search's kernels (`generation.search.SearchKernels`).

`generation.decoding` builds every search it compiles with these kernels
(and so do the server's programs and the SavedModel export); the rows a
search runs with (`one_row_padding`, `two_halves`) are chosen where it runs
(`generation.search_runner`). A path switched off, or one that does not
apply, leaves the plain kernel.

Example:
>>> from keras_transformer.generation.search import SearchKernels
>>> from keras_transformer.speed_paths.runtime import Runtime
>>> search_kernels(Runtime("torch", "cpu"), jit_compile=False, traced=False).argmax is SearchKernels().argmax
True
>>> search_kernels(Runtime("jax", "cpu"), jit_compile=True, traced=True).argmax is SearchKernels().argmax
False
"""

from functools import partial

from keras_transformer.generation.search import SearchKernels
from keras_transformer.speed_paths import chunked_top_k, compiled_torch_step, first_argmax_by_max, output_projection
from keras_transformer.speed_paths.runtime import Runtime


def search_kernels(runtime: Runtime, jit_compile: bool, traced: bool) -> SearchKernels:
    """The kernels of a search on `runtime`.

    Args:
        runtime: what the paths are chosen from (and switched off by).
        jit_compile: the model's `compile(jit_compile=...)`, resolved: on
            torch, it opts in to `compiled_torch_step`.
        traced: the search is traced into one graph (`tf.function`,
            `jax.jit`), where `chunked_top_k` pays.
    """
    plain = SearchKernels()
    return SearchKernels(
        step_logits=partial(output_projection.step_logits, runtime=runtime),
        argmax=first_argmax_by_max.first_argmax_by_max
        if first_argmax_by_max.PATH.applies_to(runtime)
        else plain.argmax,
        best_extensions=(
            chunked_top_k.best_extensions_in_chunks
            if traced and chunked_top_k.PATH.applies_to(runtime)
            else plain.best_extensions
        ),
        compile_body=(
            compiled_torch_step.compiled_step if jit_compile and compiled_torch_step.PATH.applies_to(runtime) else None
        ),
    )
