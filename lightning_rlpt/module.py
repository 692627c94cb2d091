"""`RLModule`: GRPO-family RL post-training of a Hugging Face causal LM as a LightningModule."""
from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, Sequence

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import nn

from .algorithms.advantages import estimator_requests
from .algorithms.correction import check_mode
from .algorithms.entropy_bonus import check_entropy_coef
from .algorithms.entropy_mask import check_top_entropy_quantile
from .algorithms.kl import KL_ESTIMATORS
from .algorithms.presets import check_objective, resolve_objective
from .batching import MicroBatching
from .checkpoint import check_resume_overrides, load_state, remember_counters, save_state
from .checkpoint_io import install_atomic_io
from .compat.trl import RefusesTRLNames
from .data import collate_prompts
from .experience import Experience
from .hooks import RLHookCaller
from .knobs import Knobs, Requests
from .metrics import pass_at_k_metrics
from .model.distributed import is_model_parallel, reduce_over_ranks, shard_with_fsdp2
from .model.logprobs import check_head, check_padding_free
from .model.loading import check_model_source, load_policy, load_tokenizer, lora_as_dict, zero_dropout
from .model.precision import check_cpu_precision, warn_lost_updates
from .model.reference import build_reference, check_reference_options, park_offloaded
from .options import (GROUP_ONLY, AgentOptions, CheckpointOptions, LoadingOptions, MemoryOptions, ObjectiveOptions,
                      OptimizationOptions, RewardOptions, ValidationOptions, record_flat, ungroup)
from .optim import build_optimizer, build_scheduler, check_update_numbers, for_precision, optimizer_factory, run_steps
from .quiet import hide_lightning_tips
from .requeue import BatchBoundaryRequeue
from .rewards import RewardFunctions, TrainerState, score_experience
from .rollout import HFGenerateEngine, RolloutEngine, SamplingConfig
from .rollout.episodes import Agent
from .rollout.parity import ParityProbe
from .rollout.episodes.tools import DEFAULT_MAX_CHARS
from .seeding import keyed_generator, keyed_seed
from .stages.experience import MakeExperience
from .stages.fit_state import FitState
from .stages.head_in_forward import HeadInForward
from .stages.timing import StepTimer
from .stages.update import PolicyUpdate


class RLModule(RefusesTRLNames, MakeExperience, PolicyUpdate, RLHookCaller, L.LightningModule):
    """RL post-training (GRPO, DAPO, Dr. GRPO, ...) of any Hugging Face causal LM.

    Each training batch of prompts is rolled out (``group_size`` completions per prompt), scored
    by the reward functions, turned into advantages and trained on for ``updates_per_rollout``
    passes of mini-batches, one optimizer step each (manual optimization). Without a rollout
    callback on the Trainer, completions come from ``transformers.generate`` on the policy.

    Args:
        model: a hub id, a local directory, or an ``nn.Module`` (then pass ``tokenizer``).
        reward_funcs: ``fn(prompts, completions, **columns) -> list[float]`` or a list of them.
        objective: a preset (``grpo``, ``dapo``, ``dr_grpo``) or a policy-loss name.
        group_size: completions per prompt, G.
        kl_coef: β of the KL-to-reference term (None: the preset's). 0 builds no reference.
        kl_estimator: ``k1`` (default), ``k2``, ``k3``, ``k3_ratio``, ``k3_seq_ratio`` or ``future_k1``; see `algorithms.kl`.
        advantage / policy_loss / loss_aggregation / clip_low / clip_high / dual_clip: override
            the preset.
        advantage_kwargs / policy_loss_kwargs: extra options for the selected functions.
        reward_weights: one weight per reward function.
        multi_objective_aggregation: ``sum_then_normalize`` (default: the weighted sum, then the advantage
            estimator) or ``normalize_then_sum`` (GDPO, TRL's name: each function normalised per group first).
        reward_on_error: ``raise`` or ``zero`` (score failing samples 0, count them).
        reward_timeout: seconds each reward call may take (sync, async or remote), None for no
            limit (the default, as TRL); an overrun is handled per ``reward_on_error``. See docs/rewards.md.
        tokenizer: a tokenizer or path (default: from ``model``).
        lora: a ``peft.LoraConfig`` or dict of its arguments; None trains all weights.
        quantization: ``"nf4"``/``"fp4"`` loads the base in 4 bits (QLoRA; needs ``lora``).
        torch_dtype: dtype to load the model in (default float32).
        generation: `SamplingConfig` or dict for training rollouts.
        val_generation: for validation (default greedy, same budget).
        val_samples: completions per validation prompt (pass@k for k in ``val_pass_k``).
        success_threshold: a completion counts as correct when its total reward ≥ this.
        updates_per_rollout: μ, passes over each rollout (> 1 reuses the stored old log-probs).
        minibatch_size: sequences per optimizer step (default: the whole rollout).
        micro_batch_size / max_tokens_per_micro_batch: cap each forward/backward at this many
            sequences / padded tokens (rows × the micro-batch's own longest prompt + completion,
            rows grouped by length); gradients accumulate to exactly the one-pass gradient of the
            mini-batch, still one optimizer step per mini-batch. The same caps chunk the no-grad
            forwards (reference, old log-probs, entropies), never generation, which has its own
            cap (``generation=dict(max_batch_rows=...)``, see `SamplingConfig`). A prompt that
            could not fit with ``max_new_tokens`` is refused before its rollout (see
            `lightning_rlpt.batching`). None: no cap (one pass).
        padding_free: run every policy/reference forward on one packed row (each micro-batch's
            real tokens, ``position_ids`` restarting per sequence, no attention mask): no compute
            on padding, and the token cap counts real tokens. Needs sdpa, eager or
            flash-attention (refused otherwise); gives the padded path's log-probs and gradients
            (tested on CPU with sdpa and eager). Generation is not packed. See docs/memory.md.
        optimizer: a callable ``params -> Optimizer`` (LightningCLI's ``OptimizerCallable``: in a
            config, a ``class_path`` with ``init_args``), e.g. ``functools.partial(
            bitsandbytes.optim.AdamW8bit, lr=1e-6)``. None: AdamW from ``lr`` / ``weight_decay`` /
            ``betas`` (defaults 1e-6 / 0 / (0.9, 0.999)), which are then refused: set them inside
            the callable. Checked at construction (and bitsandbytes' support of the device when
            fitting starts), before any rollout.
        lr_scheduler: a callable ``optimizer -> LRScheduler`` (``LRSchedulerCallable``), stepped
            after every optimizer step, e.g. ``functools.partial(lightning_rlpt.optim.WarmupLinearLR,
            warmup_steps=10)`` (its length: the run's, `optim.run_steps`); None: constant. Checkpointed by Lightning;
            the module logs the rate as ``learning_rate`` (no ``LearningRateMonitor`` needed).
        lr / weight_decay / betas / max_grad_norm: the default AdamW (lr > 0) and gradient clipping
            (``Trainer(gradient_clip_val=c)`` sets ``max_grad_norm=c``; ``accumulate_grad_batches`` is refused).
        disable_dropout: set every dropout probability of the policy (and so of its reference)
            to 0 (default True; TRL's ``disable_dropout`` defaults to False): the loss forward sees
            the policy that sampled and the reference is deterministic. The policy trains in
            train mode either way; with dropout kept, the reference runs in eval mode.
        mask_truncated_completions: leave completions that hit the token budget without EOS out
            of the loss (TRL's name; DAPO's overlong filtering). They still count in their
            group's advantages, and, as in TRL, as (empty) rows of the ``seq-mean-*`` means.
        top_entropy_quantile: ρ in (0, 1] (TRL's name): only the fraction ρ of each mini-batch's
            trained tokens with the highest entropy (over all ranks) keep the policy-gradient term
            (Wang et al., arXiv 2506.01939; 0.2 there); KL and denominators are unchanged. 1.0: all
            tokens. See `algorithms.entropy_mask` and docs/long_reasoning.md.
        entropy_coef: TRL's entropy bonus: the loss minus this × the mean entropy of the trained tokens
            (those ``top_entropy_quantile`` keeps), whatever the aggregation. 0 (default): none.
        rollout_logprobs: the built-in HF engine also reports the sampling (behaviour)
            log-probs (callbacks and losses that need them ask for them themselves:
            ``ESSScaledLR``, ``decoupled_ppo``); vLLM engines always report them.
        tools / max_turns / tool_timeout / tool_max_chars / tool_parser / environment / rollout_func:
            multi-turn episodes (`rollout.episodes.Agent`, docs/agents.md): tool functions, model turns
            per episode (default 10 with tools or an environment), seconds per tool call, characters
            of a tool result the model reads (default 10,000; None: no cap), the tool-call parser
            (Hermes ``<tool_call>`` by default), an environment factory, or a ``rollout_func``
            replacing the loop. Tool/environment tokens stay out of the loss.
        reference: force (True) or forbid (False) a reference model; None: when ``kl_coef > 0``.
        reference_dtype / reference_offload: a full-FT reference in e.g. ``"bfloat16"`` / on CPU between forwards.
        use_fused_kernel: compute log-probs with the fused kernel where the head allows.
        head_gradient: ``"forward"`` forms the head's gradient in the loss's forward pass where the head
            and options allow (three GEMMs, not four: `stages.head_in_forward`); ``"recompute"`` always
            recomputes the logits in the backward; ``"auto"``: forward on CPU, recompute on GPU. Chunks are
            whole rows of at most 32 MiB of logits: e.g. completions up to 262 tokens at a vocabulary of 32,000
            (docs/kernels.md); longer ones recompute.
        rollout_correction: train/inference mismatch correction when the engine reports
            behaviour log-probs: ``token_tis``, ``seq_tis``, ``token_mis``, ``seq_mis`` or None
            (see `algorithms.correction`); ``"auto"``: ``token_tis``, or None for losses that correct
            themselves (``decoupled_ppo``). ``rollout_correction_cap`` is its cap. The weights
            multiply the policy-gradient term only (as TRL and verl);
            ``rollout_correction_kl=True`` weights the KL term too (see `algorithms.surrogate`).
        parity_every / parity_threshold: the sampling-parity probe (`rollout.parity`): after the
            first training rollout's generation of a fit and then every ``parity_every`` weight syncs,
            the engine completes one prompt greedily and the trainer scores it; ``sampling/parity_max``
            is logged and a gap above ``parity_threshold`` stops the run before the step is scored or
            trained ("auto": 1e-2 in fp32, 0.3 when either side is bf16/fp16; None: log only).
            ``parity_every=0`` or None: never probe. Default 10: ~1 % of a step (docs/vllm.md).
        seed: seeds the LoRA initialisation and the rollout seeds, which each rank draws its own
            (`seeding`: the ``rollout`` stream).
        seed_per_prompt: derive each prompt's sampling seed from the rollout seed and the
            prompt's dataset index, so completions do not depend on how prompts are batched or
            spread over ranks (every engine samples each row from its own seed). A prompt drawn
            twice in one batch gets two independent groups.
        resume_overrides / checkpoint_checksums: settings (`checkpoint.ALGORITHM_KEYS`) a resumed
            fit may change (others must match the checkpoint's); write and verify a CRC32 per tensor.
        loading / objective / rewards / memory / optimization / validation / agent / checkpointing: the
            same arguments in groups (`lightning_rlpt.options`: ``memory=MemoryOptions(micro_batch_size=4)``,
            ``objective=ObjectiveOptions("dapo", kl_coef=0.0)``); a setting given flat and in a group
            must agree. The hyper-parameters record the flat names.

    Examples:
        >>> module = RLModule("path/to/model", reward_funcs=[my_reward], objective="grpo", group_size=8)  # doctest: +SKIP
        >>> L.Trainer(max_steps=100).fit(module, datamodule=PromptDataModule("prompts.jsonl"))  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str | nn.Module,
        reward_funcs: Any,
        *,
        objective: str | ObjectiveOptions = "grpo",
        group_size: int = 8,
        kl_coef: float | None = None,
        kl_estimator: str = "k1",
        advantage: str | None = None,
        policy_loss: str | None = None,
        loss_aggregation: str | None = None,
        clip_low: float | None = None,
        clip_high: float | None = None,
        dual_clip: float | None = None,
        advantage_kwargs: dict[str, Any] | None = None,
        policy_loss_kwargs: dict[str, Any] | None = None,
        reward_weights: Sequence[float] | None = None,
        multi_objective_aggregation: str = "sum_then_normalize",
        reward_on_error: str = "raise",
        reward_timeout: float | None = None,
        tokenizer: Any = None,
        lora: Any = None,
        quantization: str | None = None,
        torch_dtype: Any = None,
        gradient_checkpointing: bool = False,
        generation: SamplingConfig | dict | None = None,
        val_generation: SamplingConfig | dict | None = None,
        val_samples: int = 1,
        val_pass_k: Sequence[int] | None = None,
        success_threshold: float = 1.0,
        updates_per_rollout: int = 1,
        minibatch_size: int | None = None,
        micro_batch_size: int | None = None,
        max_tokens_per_micro_batch: int | None = None,
        padding_free: bool = False,
        optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        lr: float | None = None,
        weight_decay: float | None = None,
        betas: tuple[float, float] | None = None,
        max_grad_norm: float | None = 1.0,
        reference: bool | None = None,
        reference_dtype: str | None = None, reference_offload: bool = False,
        use_fused_kernel: bool = True, head_gradient: str = "auto",
        rollout_correction: str | None = "auto",
        rollout_correction_cap: float = 2.0,
        rollout_correction_kl: bool = False,
        parity_every: int | None = 10,
        parity_threshold: float | str | None = "auto",
        seed: int = 0,
        seed_per_prompt: bool = False,
        disable_dropout: bool = True,
        mask_truncated_completions: bool = False,
        top_entropy_quantile: float = 1.0,
        entropy_coef: float = 0.0,
        rollout_logprobs: bool = False,
        tools: Any = None,
        max_turns: int | None = None,
        tool_timeout: float = 10.0,
        tool_max_chars: int | None = DEFAULT_MAX_CHARS,
        tool_parser: Any = None,
        environment: Any = None,
        rollout_func: Any = None,
        resume_overrides: Sequence[str] = (),
        checkpoint_checksums: bool = True,
        loading: LoadingOptions | None = None, rewards: RewardOptions | None = None,
        memory: MemoryOptions | None = None, optimization: OptimizationOptions | None = None,
        validation: ValidationOptions | None = None, agent: AgentOptions | None = None,
        checkpointing: CheckpointOptions | None = None,
    ):
        super().__init__()
        flat, grouped = ungroup(locals(), RLModule.__init__)  # the groups spread into the flat names
        o = SimpleNamespace(**flat)
        check_model_source(o.model)
        self.save_hyperparameters(ignore=["model", "reward_funcs", "tokenizer", "lora", "optimizer", "lr_scheduler",
                                          "tools", "tool_parser", "environment", "rollout_func", *GROUP_ONLY])
        record_flat(self, grouped)  # what checkpoints and loggers keep: the flat names
        # What `export_checkpoint` needs to rebuild the model: the base path and the adapter config.
        # A local directory is recorded absolute, so an export from another working directory finds it.
        # Saved beside the hyper-parameters, not in them: LightningCLI feeds a checkpoint's
        # hyper-parameters back as constructor arguments (`fit/validate --ckpt_path`).
        path = None if isinstance(o.model, nn.Module) else str(o.model)
        self.model_source = {"model_name_or_path": os.path.abspath(path) if path and os.path.isdir(path) else path,
                             "lora_config": lora_as_dict(o.lora)}
        self.automatic_optimization = False
        hide_lightning_tips()  # before the Trainer is built: it prints the first (lightning_rlpt.quiet)
        self.objective = resolve_objective(o.objective, dict(
            policy_loss=o.policy_loss, advantage=o.advantage, loss_aggregation=o.loss_aggregation,
            clip_low=o.clip_low, clip_high=o.clip_high, dual_clip=o.dual_clip, kl_coef=o.kl_coef))
        KL_ESTIMATORS.get(o.kl_estimator)
        check_reference_options(o.reference_dtype, o.reference_offload, o.lora)
        check_update_numbers(o.updates_per_rollout, o.minibatch_size, o.val_samples, o.lr)
        self.optimizer_factory = optimizer_factory(o.optimizer, o.lr, o.weight_decay, o.betas)
        self.scheduler_factory = o.lr_scheduler
        check_top_entropy_quantile(o.top_entropy_quantile)
        check_entropy_coef(o.entropy_coef)
        self.head_in_forward = HeadInForward(o.head_gradient)
        self.micro_batching = MicroBatching(o.micro_batch_size, o.max_tokens_per_micro_batch, bool(o.padding_free))
        if o.rollout_correction == "auto":
            o.rollout_correction = None if self.objective.self_correcting else "token_tis"
        check_mode(o.rollout_correction, o.rollout_correction_cap)
        check_objective(self.objective, group_size=o.group_size, advantage_kwargs=o.advantage_kwargs,
                        rollout_correction=o.rollout_correction, updates_per_rollout=o.updates_per_rollout,
                        policy_loss_kwargs=o.policy_loss_kwargs)
        self.hparams.rollout_correction = o.rollout_correction
        self.hparams.resume_overrides = check_resume_overrides(o.resume_overrides)
        self.group_size, self.kl_estimator = o.group_size, o.kl_estimator
        # The surface callbacks move and ask through (see hooks.py): knobs and requests.
        self.knobs = Knobs(self.objective.kl_coef, self.objective.clip_low, self.objective.clip_high)
        self.requests = Requests(rollout_logprobs=o.rollout_logprobs or self.objective.self_correcting)
        self.requests.ask(**estimator_requests(self.objective.advantage))  # the log-probs its `needs` take
        self.advantage_kwargs = dict(o.advantage_kwargs or {})
        self.policy_loss_kwargs = dict(o.policy_loss_kwargs or {})
        self.rewards = RewardFunctions(o.reward_funcs, o.reward_weights, o.reward_on_error, timeout=o.reward_timeout,
                                       aggregation=o.multi_objective_aggregation)
        self.sampling = SamplingConfig.coerce(o.generation)
        self.micro_batching.check_fits(1, self.sampling.max_new_tokens)  # even a one-token prompt must fit
        self.val_sampling = SamplingConfig.coerce(
            o.val_generation if o.val_generation is not None else {**self.sampling.to_dict(), "temperature": 0.0})
        if self.sampling.temperature <= 0:
            raise ValueError("training rollouts must sample: generation temperature must be > 0")
        self.tokenizer = load_tokenizer(o.model, o.tokenizer)
        self.agent = Agent(o.tools, o.max_turns, o.tool_timeout, o.tool_parser, o.environment, o.rollout_func,
                           o.tool_max_chars)
        self.agent.check(self.tokenizer)  # a template without tool support fails here, before any rollout
        self.policy = load_policy(o.model, lora=o.lora, quantization=o.quantization, torch_dtype=o.torch_dtype,
                                  gradient_checkpointing=o.gradient_checkpointing, seed=o.seed)
        check_head(self.policy)  # a logit transform we would not reproduce fails here, before any rollout
        if o.padding_free:
            check_padding_free(self.policy)
        if o.disable_dropout:
            zero_dropout(self.policy)
        self.policy.train()  # from_pretrained returns eval mode; Lightning trains in train mode
        self.use_reference = self.knobs.kl_coef > 0 if o.reference is None else bool(o.reference)
        # Call the optimizer and scheduler callables once now, so a wrong one fails before any rollout.
        build_scheduler(o.lr_scheduler, build_optimizer(self.optimizer_factory, self._trainable(), check_device=False))
        self.reference = build_reference(self.policy, self.use_reference, o.reference_dtype, o.reference_offload)
        self.rollout_engine: RolloutEngine | None = None
        self.policy_version = 0
        self.rng, self.rollout_draws = torch.Generator().manual_seed(o.seed), 0  # see _next_seed
        self.timer = StepTimer()
        self.parity = ParityProbe(o.parity_every, o.parity_threshold)
        self.fit_state = FitState()  # replaced at each fit's start (on_fit_start)
        self.val_pass = nn.ModuleDict(pass_at_k_metrics(o.val_pass_k, o.val_samples, self.val_sampling.temperature))

    # ---------------------------------------------------------------- the callbacks' surface
    def request(self, **flags: bool) -> None:
        """Ask for extra tensors (see `Requests`): ``module.request(old_logprobs=True)``."""
        self.requests.ask(**flags)
        if self.rollout_engine is not None and self.rollout_engine is getattr(self, "_default_engine", None):
            self.rollout_engine.return_logprobs = self.requests.rollout_logprobs

    @property
    def success_threshold(self) -> float:
        return self.hparams.success_threshold

    @property
    def reward_names(self) -> list[str]:
        return self.rewards.names

    @property
    def episodes(self) -> bool:
        """Rollouts are multi-turn episodes (tools, an environment or a ``rollout_func``)."""
        return self.agent.active

    def policy_logprobs(self, exp: Experience, with_entropy: bool = False, entropy_grad: bool = False):
        """``(log-probs [N, C], entropies or None)`` of ``exp``'s completions under the policy, at
        the sampling temperature (the fused kernel where the head allows). Grad follows the caller;
        the entropies carry it only with ``entropy_grad`` (full logits keep another ``[N, C, V]``)."""
        return self._logprobs(self.policy, exp, with_entropy=with_entropy, entropy_grad=entropy_grad)

    def refill(self, rows: list[dict[str, Any]], seed: int) -> Experience:
        """Roll out and score dataset ``rows`` (every callback's ``on_rollout_end`` runs): the
        entry point for filters that top up a batch (``CurriculumSampler``)."""
        return self.rollout_and_score(collate_prompts(rows), seed)[0]

    def _agree_count(self, count: int) -> int:
        """Under FSDP2 each forward gathers parameters, so every rank runs as many as the rank with
        the most; elsewhere ranks go their own way."""
        if not getattr(self, "_sharded", False):
            return count
        return int(reduce_over_ranks(self._trainer, [count], op="max")[0])

    # ---------------------------------------------------------------- Lightning plumbing
    @property
    def engine(self) -> RolloutEngine:
        if self.rollout_engine is None:
            self.rollout_engine = HFGenerateEngine(  # generation's own cap: generation=dict(max_batch_rows=...)
                self.policy, self.tokenizer.eos_token_id, self.tokenizer.pad_token_id,
                return_logprobs=self.requests.rollout_logprobs)
            self._default_engine = self.rollout_engine  # `request` keeps its flag current
        return self.rollout_engine

    def configure_model(self) -> None:
        """Check the precision; under ``ModelParallelStrategy``, shard the policy (and a full-FT reference) with FSDP2."""
        check_cpu_precision(self._trainer)
        self.rewards.to(self._trainer.strategy.root_device)  # reward models: outside the module tree, a full copy per rank
        if is_model_parallel(self._trainer) and not getattr(self, "_sharded", False):
            mesh = self.device_mesh["data_parallel"]
            shard_with_fsdp2(self.policy, mesh)
            if self.reference is not None:
                shard_with_fsdp2(self.reference, mesh)
            self._sharded = True

    def setup(self, stage: str) -> None:
        install_atomic_io(self._trainer)  # checkpoints written atomically, checked at load (checkpoint_io.py)

    def on_fit_start(self) -> None:
        park_offloaded(self.reference)  # reference_offload: back to CPU memory after the strategy moved the module
        self.parity.reset()  # each fit probes its engine before its first training rollout
        self.check_engine()  # after the callbacks' on_fit_start: theirs is installed and synced
        # each fit afresh: the no-signal warning may come once; SLURM's auto-requeue acts between batches
        self.fit_state = FitState(requeue=BatchBoundaryRequeue.install(self._trainer))

    def on_train_start(self) -> None:
        self.sync_if_behind()  # a sharded checkpoint is restored after on_fit_start

    def _trainable(self) -> list[nn.Parameter]:
        return [p for p in self.policy.parameters() if p.requires_grad]

    def configure_optimizers(self):
        """The optimizer (and scheduler, stepped per optimizer step by `PolicyUpdate`) from the callables."""
        params = self._trainable()
        optimizer = build_optimizer(for_precision(self.optimizer_factory, self._trainer.precision_plugin), params)
        warn_lost_updates(self._trainer.precision, params, max(group["lr"] for group in optimizer.param_groups))
        scheduler = build_scheduler(self.scheduler_factory, optimizer, run_steps(
            self._trainer, self.hparams.updates_per_rollout, self.hparams.minibatch_size))  # a length left out: the run's
        if scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # Lightning's checkpoint hooks (checkpoint.py): load refuses one without our state, other settings or bad tensors.
    on_save_checkpoint, on_load_checkpoint = save_state, load_state
    def on_train_batch_end(self, *_: Any) -> None:
        remember_counters(self)  # the counters a crash in the next batch is checkpointed with
        if self.fit_state.requeue is not None:  # None: not SLURM with auto_requeue (requeue.py)
            self.fit_state.requeue.at_batch_end()

    def _next_seed(self) -> int:
        """The next rollout seed, keyed by (seed, rank, draw) (`seeding`); the mini-batch shuffle continues ``self.rng``."""
        rank = 0 if self.hparams.seed_per_prompt else self.global_rank  # seed_per_prompt: the prompt index keys
        self.rng, self.rollout_draws = keyed_generator("rollout", self.hparams.seed, rank, self.rollout_draws), self.rollout_draws + 1
        return int(torch.randint(0, 2**62, (1,), generator=self.rng).item())

    # ---------------------------------------------------------------- validation
    def validation_step(self, batch: dict[str, list[Any]], batch_idx: int) -> None:
        n = self.hparams.val_samples
        seed = keyed_seed("validation", self.hparams.seed, batch_idx)
        exp, _ = self.sample(batch, n, self.val_sampling, seed)  # episodes too, with tools/environments
        score_experience(exp, self.rewards, TrainerState.of(self._trainer))
        correct = (exp.scores >= self.hparams.success_threshold).view(-1, n)
        for k, metric in self.val_pass.items():
            metric.update(correct)
            self.log(f"val/pass_at_{k}", metric, on_epoch=True, batch_size=correct.shape[0])
        self.log("val/accuracy", correct.float().mean(), on_epoch=True, sync_dist=True, batch_size=correct.numel())
        self.log("val/reward", exp.scores.mean(), on_epoch=True, sync_dist=True, batch_size=correct.numel())

    def _log_dict(self, values: dict[str, float], prog_bar_keys: Sequence[str] = ("reward",), sync: bool = True) -> None:
        """Log per step; with ``sync`` the value is reduced over ranks (min/max for */min, */max)."""
        for k, v in values.items():
            reduce = "min" if k.endswith("/min") else "max" if k.endswith("/max") else "mean"
            self.log(k, float(v), on_step=True, on_epoch=False, prog_bar=k in prog_bar_keys, sync_dist=sync,
                     reduce_fx=reduce, batch_size=1)
