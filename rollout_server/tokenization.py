"""POST /tokenize and /detokenize, as vLLM serves them.

An RL trainer that builds its own token-in/token-out prompts asks the server for the ids it would use:
/tokenize renders messages exactly as chat completions do (same template, tools, session prefixes), so
the ids it returns are the ids a chat request with the same body is served on.
"""

from __future__ import annotations

from rollout_server.auth import Principal
from rollout_server.chat import checked_tools, prompt_ids_for
from rollout_server.protocol import DetokenizeRequest, TokenizeRequest
from rollout_server.request_limits import check_session_ids
from rollout_server.serving.context import ServingContext
from rollout_server.serving.prompt_checks import check_in_vocabulary
from rollout_server.session_prompts import team_session
from rollout_server.tokenizer import tokenize_off_the_loop


async def tokenize(ctx: ServingContext, req: TokenizeRequest, session_header: str | None, who: Principal) -> dict:
    if req.model is not None:
        ctx.target(req.model, who)
    if req.messages is not None:
        check_session_ids(ctx.settings.limits, x_session_id=session_header, session_id=req.session_id)
        if req.tools:
            await checked_tools(ctx, req.tools)  # refused as a chat request with these tools would be
        named_session = team_session(who.team, session_header or req.session_id)
        ids = await prompt_ids_for(ctx, req, named_session, bool(req.add_special_tokens))
    else:
        encode = ctx.tokenizer.encode if req.add_special_tokens is False else ctx.tokenizer.encode_prompt
        ids = await tokenize_off_the_loop(len(req.prompt), lambda: encode(req.prompt))
    return {"count": len(ids), "max_model_len": ctx.max_model_len, "tokens": ids,
            "token_strs": ctx.tokenizer.hf.convert_ids_to_tokens(ids) if req.return_token_strs else None}


async def detokenize(ctx: ServingContext, req: DetokenizeRequest, who: Principal) -> dict:
    if req.model is not None:
        ctx.target(req.model, who)
    check_in_vocabulary(ctx, req.tokens, "tokens")
    text = await tokenize_off_the_loop(  # ~4 characters a token
        4 * len(req.tokens), lambda: ctx.tokenizer.decode(req.tokens, skip_special_tokens=False))
    return {"prompt": text}
