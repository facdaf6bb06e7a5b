"""Oracle packing: a lower bound for a synchronous step, NOT a real policy (POLICIES.md section 5).

The only policy allowed to read response lengths before they are generated (`oracle = True`
unlocks `view.oracle_lengths`). Each step it takes the same P0 prompts as `sync`, launches the
same P0 x R0 samples and trains on all of them, but places every sample on an instance by
longest-processing-time first (LPT) with the profile's cost model: samples in decreasing length,
each to the instance whose predicted finish time grows least. An instance's predicted time for
samples of lengths L_j with prompts P_j is

    t_w * max(max_j L_j, sum_j L_j / c) + (alpha + gamma) * sum_j L_j + beta * sum_j (P_j L_j + L_j^2 / 2)

(the iteration model summed over the iterations of a batch that shrinks as samples finish), with
c the concurrency the instance can hold (`max_num_seqs`, or what its KV capacity fits). Longer
samples are also launched first so FCFS admission starts them first. It bounds what knowing
lengths buys a synchronous step; asynchronous policies can beat it.
"""

from __future__ import annotations

import numpy as np

from rlsim.protocol import Action, Event, Finished, Launch, PolicyView, Train


class OraclePolicy:
    """Synchronous steps with perfect length knowledge and LPT placement."""

    name = "oracle"
    on_policy = True
    oracle = True

    def __init__(self) -> None:
        self.done: list[int] = []
        self.expected = 0

    def on_step_start(self, view: PolicyView) -> list[Action]:
        r0 = view.samples_per_prompt
        prompts = view.take_prompts(view.prompts_per_step)
        self.done, self.expected = [], len(prompts) * r0
        lengths = {p: [min(x, view.max_response_len) for x in view.oracle_lengths(p)[:r0]] for p in prompts}
        work = sorted(((n, p, s) for p in prompts for s, n in enumerate(lengths[p])), key=lambda x: (-x[0], x[1], x[2]))
        prof, n_inst = view.profile, view.num_instances
        max_len, tokens, ctx, kv, count = (np.zeros(n_inst) for _ in range(5))
        where: dict[tuple[int, int], int] = {}
        for length, p, s in work:
            prompt = view.prompt_tokens(p)
            new_tokens, new_kv, new_count = tokens + length, kv + prompt + length / 2, count + 1
            conc = np.clip(prof.kv_capacity_tokens * new_count / new_kv, 1, prof.max_num_seqs)
            t = (
                prof.t_w_s * np.maximum(np.maximum(max_len, length), new_tokens / conc)
                + (prof.alpha_s + prof.gamma_s) * new_tokens
                + prof.beta_s * (ctx + prompt * length + length * length / 2)
            )
            i = int(np.argmin(t))
            where[(p, s)] = i
            max_len[i] = max(max_len[i], length)
            tokens[i], kv[i], count[i] = new_tokens[i], new_kv[i], new_count[i]
            ctx[i] += prompt * length + length * length / 2
        # The driver numbers a prompt's samples in launch order, so each prompt launches its
        # samples in order; prompts go longest first so FCFS admission starts long work first.
        order = sorted(prompts, key=lambda p: (-max(lengths[p], default=0), p))
        actions: list[Action] = [Launch(p, 1, instance=where[(p, s)]) for p in order for s in range(len(lengths[p]))]
        return actions

    def on_event(self, event: Event, view: PolicyView) -> list[Action]:
        if isinstance(event, Finished):
            self.done.append(event.request_id)
            if len(self.done) == self.expected:
                return [Train(tuple(self.done))]
        return []
