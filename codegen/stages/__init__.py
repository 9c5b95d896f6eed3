"""Stage kinds. One kind = one module here (its pydantic model and its
lowering), one template ``templates/stages/<kind>.j2``, one reference function
in ``codegen/reference/`` and its tests, all named alike.

To add a kind: write ``codegen/stages/<kind>.py`` with ``Model`` (a
``StageBase`` whose ``kind`` is ``Literal["<kind>"]``) and ``lower(stage, ctx)``,
add it to ``KINDS`` below, and write its template. ``STAMPED_POINTS`` names the
generic timeline points (``start_point`` / ``done_point``) its template stamps:
a spec that sets another is refused rather than left unstamped."""

from . import gemv_fp8, gemv_mxfp8, head_norm_rope, index_scores, key_table, mla_norm_rope, mxfp8_quant, rmsnorm_fp8

KINDS = {
    m.KIND: m
    for m in (
        rmsnorm_fp8, gemv_fp8, head_norm_rope, index_scores,  # MiniMax-M3 pre_attn
        mxfp8_quant, key_table, gemv_mxfp8, mla_norm_rope,  # DeepSeek-V4.1 attn_front
    )
}
