"""The client-side rate budget for tests against the local server, which has no rate limit of its own.

At the defaults (500 requests and 200k tokens a minute) the budget, not the code under test, sets the
pace of a test's LLM stages: the evaluation's judge stage alone waited half a minute for it. Tests
that check pacing (``test_llm_client``, ``test_llm_server``, the benchmarks) set their own limits;
``test_refresh_llm`` keeps the default, so that its report stage lasts long enough to be interrupted."""

UNTHROTTLED = tuple(f"llm.{model}.{limit}=1000000000" for model in ("chat", "embedding")
                    for limit in ("requests_per_minute", "tokens_per_minute"))
