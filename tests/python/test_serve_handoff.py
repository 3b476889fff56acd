"""kiln.batching.Batcher's hand-off between the event loop and its inference threads, on the cpu
backend (no server): joined requests each get their own rows of one inference; an inference
that fails fails every request joined into it, and the batcher keeps serving; a request whose
waiter is cancelled leaves the others of its batch answered; a closed batcher answers with an
error instead of raising; check_request's dtype test, which answers from NumPy's dtype objects
first, takes and refuses what it did before. Every wait is bounded."""
import asyncio

import numpy as np
import pytest

from kiln.batching import Batcher, RequestError, check_request


def _x(batch, seed):
    return np.random.default_rng(seed).standard_normal((batch, 3, 32, 32)).astype(np.float32)


def _run(coro):
    return asyncio.run(asyncio.wait_for(coro, 60))


def test_joined_requests_get_their_own_rows(cnn_engine):
    ctx = cnn_engine.create_context()
    batcher = Batcher(cnn_engine, contexts=2, max_batch=8, max_delay_s=0.05)
    try:
        xs = [_x(b, k) for k, b in enumerate([1, 2, 1, 3, 1])]

        async def main():
            return await asyncio.gather(*[batcher.infer({"input": x}) for x in xs])

        outs = _run(main())
        for x, out in zip(xs, outs):
            want = ctx.run({"input": x})["probabilities"]
            assert out["probabilities"].shape == want.shape
            assert np.abs(out["probabilities"] - want).max() < 1e-5
        st = batcher.stats
        assert st.requests == 5 and st.samples == 8 and st.inferences < 5
        assert st.batched_requests >= 2
    finally:
        batcher.close()


def test_a_failed_inference_fails_each_of_its_requests(cnn_engine):
    """Inputs the context refuses (an inner shape the engine does not take: the server's
    check_request would have refused them; Batcher trusts its caller): every request joined
    into that inference gets the error; the next inference runs as usual."""
    batcher = Batcher(cnn_engine, contexts=1, max_batch=8, max_delay_s=0.05)
    try:
        async def main():
            bad = [batcher.infer({"input": np.zeros((1, 3, 16, 16), np.float32)})
                   for _ in range(3)]
            results = await asyncio.gather(*bad, return_exceptions=True)
            good = await batcher.infer({"input": _x(2, 1)})
            return results, good

        results, good = _run(main())
        assert all(isinstance(r, Exception) for r in results), results
        assert len({id(r) for r in results}) == 1  # one inference, one error, three requests
        assert good["probabilities"].shape == (2, 10)
        assert batcher.stats.inferences == 1  # the failed one is not counted
    finally:
        batcher.close()


def test_a_cancelled_request_leaves_its_batch_answered(cnn_engine):
    batcher = Batcher(cnn_engine, contexts=1, max_batch=8, max_delay_s=0.05)
    try:
        async def main():
            futs = [asyncio.ensure_future(batcher.infer({"input": _x(1, k)})) for k in range(3)]
            await asyncio.sleep(0)  # each has submitted
            futs[1].cancel()
            return await asyncio.gather(*futs, return_exceptions=True)

        results = _run(main())
        assert isinstance(results[1], asyncio.CancelledError)
        assert results[0]["probabilities"].shape == (1, 10)
        assert results[2]["probabilities"].shape == (1, 10)
    finally:
        batcher.close()


def test_a_closed_batcher_answers_with_an_error(cnn_engine):
    batcher = Batcher(cnn_engine, contexts=1, max_batch=8, max_delay_s=0.001)
    batcher.close()

    async def main():
        alone = batcher.infer({"input": _x(8, 0)})  # a full batch: dispatched at once
        joined = batcher.infer({"input": _x(1, 0)})
        return await asyncio.gather(alone, joined, return_exceptions=True)

    results = _run(main())
    assert all(isinstance(r, RuntimeError) for r in results), results


def test_check_request_dtypes(cnn_engine):
    x = _x(1, 0)
    assert check_request(cnn_engine, {"input": x}, True) == 1
    # not NumPy's own dtype object, the same element type: taken, as before
    assert check_request(cnn_engine, {"input": x.astype(">f4")}, True) == 1
    with pytest.raises(RequestError, match="datatype FP64, the model takes FP32"):
        check_request(cnn_engine, {"input": x.astype(np.float64)}, True)
    with pytest.raises(RequestError, match="datatype FP16, the model takes FP32"):
        check_request(cnn_engine, {"input": x.astype(np.float16)}, True)


def test_close_runs_the_inferences_handed_over(cnn_engine):
    """close() stops the inference threads after the inferences already handed to them, whose
    requests get their outputs; the threads are gone after it."""
    ctx = cnn_engine.create_context()
    batcher = Batcher(cnn_engine, contexts=1, max_batch=2, max_delay_s=0.001)
    xs = [_x(2, k) for k in range(6)]  # full batches: each handed over at once

    async def main():
        waiting = [batcher.submit({"input": x}) for x in xs]  # handed over here
        closing = asyncio.get_running_loop().run_in_executor(None, batcher.close)
        outs = await asyncio.gather(*waiting)
        await closing
        return outs

    outs = _run(main())
    for x, out in zip(xs, outs):
        want = ctx.run({"input": x})["probabilities"]
        assert np.abs(out["probabilities"] - want).max() < 1e-5
    assert not any(t.is_alive() for t in batcher._threads)
    batcher.close()  # a second close does nothing


def test_a_dropped_batcher_stops_its_threads(cnn_engine):
    """A batcher dropped without close() is collected (its inference threads do not keep it)
    and its threads stop, as a ThreadPoolExecutor's did."""
    import gc
    import weakref

    batcher = Batcher(cnn_engine, contexts=2, max_batch=2, max_delay_s=0.001)
    out = _run(batcher.infer({"input": _x(2, 0)}))
    assert out["probabilities"].shape == (2, 10)
    threads, ref = batcher._threads, weakref.ref(batcher)
    del batcher, out
    gc.collect()
    assert ref() is None
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
