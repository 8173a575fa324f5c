"""Which tests prove a claim once (`make test`, about 10 minutes on 2 cores from a fresh clone)
and which repeat it over a matrix (`make test-all`, which CI runs too).

`make test` runs one case of every claim: one rank count, one framework of each kind, one
compile case, a few of the crafted-file corpus's views. The cases below (node id prefixes) prove
nothing new of their own: they repeat a claim already proven in the default tier for another
rank count, precision, framework spelling or crafted file. Each is marked `matrix` at
collection (conftest.py) and runs in `make test-all`. The 200-kill figures are `make soak`'s
(REPLAY_KILLS=200); the suite kills 16 times.
"""

from __future__ import annotations

# node id prefix -> the case of the same claim that `make test` keeps
MATRIX: dict[str, str] = {
    # every rank count: two ranks prove re-entry rank by rank, and every rank replayed together
    "tests/reentry/test_reentry.py::test_a_torchrun_program_is_replayed_rank_by_rank_by_reentry[4]": "[2]",
    "tests/integration/test_distributed.py::test_four_ranks_replay_together_bitwise": "test_verify_replays_every_rank_together_bitwise",
    # the stop votes over other failures: a NaN on one rank stops every rank at the same step
    "tests/integration/test_distributed.py::test_nonfinite_loss_with_finite_gradients_stops_every_rank_one_step_later": "test_nan_on_one_rank_stops_every_rank_at_the_same_step",
    "tests/integration/test_distributed.py::test_inf_on_one_rank_stops_every_rank_without_a_collective_of_its_own": "test_nan_on_one_rank_stops_every_rank_at_the_same_step",
    "tests/integration/test_distributed.py::test_under_a_grad_scaler_inf_gradients_are_a_skip_not_a_stop": "test_nan_on_one_rank_stops_every_rank_at_the_same_step",
    # one rank replayed alone: the together test replays one alone too
    "tests/integration/test_distributed.py::test_healthy_ddp_run_replays_bitwise_per_rank": "test_verify_replays_every_rank_together_bitwise",
    # FSDP2 in mixed precision: the fp32 run proves the shards replay together
    "tests/integration/test_fsdp.py::test_fsdp2_mixed_precision_and_pending_sharded_gradients_replay_bitwise": "test_fsdp2_ranks_record_their_own_shards_and_replay_together_bitwise",
    # kill -9 at any moment: the 16 kills of the step-in-flight test check every file and the
    # steps it holds; the older loop of fresh interpreters checks every batch (2 min on 2 cores)
    "tests/integration/test_crash_safety.py::test_sigkill_at_random_moments_leaves_every_flushed_step_intact": "test_sigkill_loses_at_most_the_step_in_flight",
    # a rank named with its op: DDP's bisect proves it in the default tier; FSDP2's shards
    # replaying together stay there too
    "tests/integration/test_fsdp.py::test_fsdp2_bisect_names_the_rank_and_the_op_a_nan_came_from": "test_fsdp2_ranks_record_their_own_shards_and_replay_together_bitwise",
    # preflight: a failing program checked, kept and bisected; its torchrun spelling repeats it
    "tests/selfcheck/test_preflight.py::test_a_torchrun_command_is_checked_with_its_whole_rank_set": "test_a_program_that_fails_within_the_preflight_steps_is_reported_bisected_and_kept",
    # upstream classes (tests/realistic/test_upstream_classes.py): gat's bisect and hogwild's
    # refusal stay; the rest repeat a claim a unit test pins in the default tier (a sparse leaf
    # comes back sparse, ulps of a float32, the samples' dim, a NaN batch is data, a model with
    # no parameters is healthy) or gat's bisect (gcn's)
    "tests/realistic/test_upstream_classes.py::test_a_sparse_graph_handed_to_the_step_as_its_batch_replays_bitwise": "tests/unit/test_tree_roundtrip.py",
    "tests/realistic/test_upstream_classes.py::test_a_full_batch_graph_run_whose_lr_explodes_is_bisected_to_the_overflowing_op[gcn": "[gat",
    "tests/realistic/test_upstream_classes.py::test_a_layer_local_run_whose_network_holds_no_parameters_is_healthy_not_non_finite": "tests/unit/test_health_flags_overflow.py",
    "tests/realistic/test_upstream_classes.py::test_every_layers_steps_of_a_layer_local_run_replay_bitwise": "(a strict xfail: the open bug)",
    "tests/realistic/test_upstream_classes.py::test_a_seq2seq_token_out_of_the_vocabulary_is_blamed_on_its_sample_along_dim_1": "tests/unit/test_trace_samples.py",
    "tests/realistic/test_upstream_classes.py::test_a_seq2seq_batch_with_an_all_padding_sentence_is_healthy_and_replays_bitwise": "test_a_sparse_graph_handed_to_the_step_as_its_batch_replays_bitwise",
    "tests/realistic/test_upstream_classes.py::test_a_siamese_pair_holding_a_nan_image_is_blamed_on_the_data_when_bce_raises": "tests/unit/test_trace_verdict.py",
    # gpu-check's sync check does nothing on the CPU: the kernel checks' run takes it
    # a program without a file to run again is told at once: read from stdin proves it
    "tests/reentry/test_no_program_file.py::test_a_program_without_a_file_is_told_at_once_that_it_will_not_replay[-c]": "[stdin]",
    # one torch.compile case: a compiled model replayed bitwise and bisected to its op
    "tests/reentry/test_reentry.py::test_a_step_that_compiles_on_its_first_call_is_traced_with_its_compiled_ops": "test_a_compiled_model_replays_bitwise_and_bisects_to_its_op",
    "tests/reentry/test_reentry.py::test_a_nan_only_the_compiled_code_makes_is_said_to_be_compiled_and_eager_disagreeing": "test_a_compiled_model_replays_bitwise_and_bisects_to_its_op",
    "tests/unit/test_trace_verdict.py::test_a_model_compiled_inside_the_traced_step_is_traced_again_seeing_compiled_ops": "tests/reentry/test_reentry.py::test_a_compiled_model_replays_bitwise_and_bisects_to_its_op",
    # a verdict is a function of the recording: PPO bisected 20 times and every other real
    # program's three commands under three hash seeds; PPO's three commands 3 times stays
    "tests/realistic/test_same_verdict.py::test_a_ppo_recording_bisected_20_times_gives_one_verdict": "test_a_ppo_recording_gives_one_verdict_under_any_hash_seed_at_once_and_under_load",
    "tests/realistic/test_same_verdict.py::test_every_real_programs_verdicts_are_the_same_every_time": "test_a_ppo_recording_gives_one_verdict_under_any_hash_seed_at_once_and_under_load",
    # gpu-check's kernel checks on the CPU: the re-entry, nan and sync checks stay
    "tests/gpu/test_gpu_check.py::test_the_kernel_checks_run_on_the_cpu": "test_the_checks_run_on_the_cpu_and_write_their_report",
    # state outside the step told while training: a global the loop changes proves it;
    # open_clip's loop-filled feature cache is another spelling of it
    "tests/realistic/test_contrastive.py::test_open_clips_own_order_caching_features_in_the_loop_is_told_while_it_trains": "tests/selfcheck/test_selfcheck.py::test_a_global_the_loop_changes_is_flagged_on_stderr_while_the_run_trains",
    # the self-check's false-alarm matrix: plain proves no false alarm
    "tests/selfcheck/test_selfcheck.py::test_healthy_runs_are_not_flagged[workers]": "[plain]",
    "tests/selfcheck/test_selfcheck.py::test_healthy_runs_are_not_flagged[amp]": "[plain]",
    # framework precisions and spellings: one of each framework stays
    "tests/integrations/test_lightning.py::test_pytorch_lightning_nan_is_found_at_its_step_with_its_op": "test_lightningcli_nan_is_found_at_its_step_with_its_op",
    # a planted replay package: a planted replay.py proves the children import this one
    "tests/harm/test_hands_off.py::test_children_import_this_replay_whatever_the_working_directory_holds[replay/__init__.py]": "[replay.py]",
    "tests/integrations/test_lightning.py::test_a_healthy_fit_replays_bitwise[16-mixed]": "[32-true]",
    "tests/integrations/test_transformers.py::test_a_healthy_train_replays_bitwise[bf16]": "[fp32]",
    "tests/integrations/test_lightning.py::test_a_module_without_save_hyperparameters_replays_by_reentry_in_both_namespaces[pytorch_lightning]": "[lightning.pytorch]",
    # every view of every crafted file in the TUI: the CLI corpus covers every file, and the
    # TUI's own refusal tests stay
    "tests/untrusted/test_tui_corpus.py::test_tui[": "test_replay_tui_refuses_a_fifo_before_drawing",
    "tests/untrusted/test_tui_corpus.py::test_replay_tui_exits_3_with_one_line_when_browsing_hits_a_damaged_record": "test_cli_corpus",
    # how a program ended outside any step: the plain program proves info, bisect and the page;
    # a `with` block's hand-over is proven by its failing sys.exit; one planted /ended of four
    "tests/integration/test_program_ended_outside_a_step.py::test_an_exception_outside_any_step_is_kept_and_bisect_names_it_instead_of_healthy[with]": "[plain]",
    "tests/integration/test_program_ended_outside_a_step.py::test_a_planted_or_damaged_ended_reads_as_no_ending_never_as_a_failure[\\xff": "[{",
    'tests/integration/test_program_ended_outside_a_step.py::test_a_planted_or_damaged_ended_reads_as_no_ending_never_as_a_failure[{"kind": "x"': "[{",
    "tests/integration/test_program_ended_outside_a_step.py::test_a_planted_or_damaged_ended_reads_as_no_ending_never_as_a_failure[[": "[{",
}


def tier(nodeid: str) -> str | None:
    """The default-tier case that stands for ``nodeid``, when ``nodeid`` is a matrix case."""
    for prefix, kept in MATRIX.items():
        if nodeid.startswith(prefix):
            return kept
    return None
