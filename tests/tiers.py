"""Which tests prove a claim once (`make test`, about 9 minutes on 2 cores from a fresh clone)
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
    "tests/reentry/test_reentry.py::test_a_torchrun_programs_bad_rank_is_bisected_by_reentry[4]": "[2]",
    # a torchrun set verified by re-entry: the set whose rank died verifies the steps every rank
    # completed, bitwise on both ranks
    "tests/reentry/test_reentry.py::test_a_torchrun_program_is_replayed_rank_by_rank_by_reentry[": "test_a_rank_that_died_outside_a_step_is_the_culprit_not_the_peer_whose_collective_failed",
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
    # a rank named with its op: a torchrun program's bisect names the rank and step (re-entry,
    # the way fresh programs replay) and the rank set's trace names each rank's op; FSDP2's
    # shards replaying together stay in the default tier too
    "tests/integration/test_fsdp.py::test_fsdp2_bisect_names_the_rank_and_the_op_a_nan_came_from": "test_fsdp2_ranks_record_their_own_shards_and_replay_together_bitwise",
    "tests/integration/test_distributed.py::test_bisect_replays_every_rank_and_names_the_rank_step_and_op": "tests/reentry/test_reentry.py::test_a_torchrun_programs_bad_rank_is_bisected_by_reentry[2] and tests/reentry/test_rank_set_names.py::test_trace_replays_every_rank_together_and_traces_each",
    # every framework's resume: a plain loop's resume proves the segments and step numbers
    "tests/integration/test_resumed_runs.py::test_a_lightning_fit_from_a_checkpoint_numbers_from_its_global_step": "test_a_resumed_plain_loop_keeps_the_first_recording_and_its_step_numbers",
    "tests/integration/test_resumed_runs.py::test_a_hugging_face_resume_keeps_the_checkpoint_step_numbers": "test_a_resumed_plain_loop_keeps_the_first_recording_and_its_step_numbers",
    # activation checkpointing's two flavours: the non-reentrant one (torch's default) stays
    "tests/realistic/test_real_programs.py::test_an_lm_trained_with_activation_checkpointing_is_bisected_and_its_recompute_placed[reentrant]": "[non_reentrant]",
    # a batch prefetched into a global by the previous step is one global the loop changes
    "tests/selfcheck/test_selfcheck.py::test_a_batch_the_previous_step_prefetched_into_a_global_is_flagged": "test_a_global_the_loop_changes_is_flagged_on_stderr_while_the_run_trains",
    # a Trainer subclass with model_init is another spelling of a Hugging Face train
    "tests/integrations/test_transformers.py::test_model_init_and_a_trainer_subclass_replay_bitwise": "test_a_healthy_train_replays_bitwise[fp32]",
    # the benchmark scripts still run: the recorder's own benchmark stays, the others (the rank
    # scan's, the batch references', the profile's) run in make test-all
    "tests/test_benchmark_scripts.py::test_bench_rankscan_finds_the_first_step_and_rank_with_every_variant": "test_bench_record_runs_every_recorder_variant",
    "tests/test_benchmark_scripts.py::test_bench_batch_refs_records_by_reference_and_by_value": "test_bench_record_runs_every_recorder_variant",
    "tests/test_benchmark_scripts.py::test_profile_record_splits_a_recorded_step_into_the_recorders_parts": "test_bench_record_runs_every_recorder_variant",
    # preflight: a failing program checked, kept and bisected; its torchrun spelling repeats it
    "tests/selfcheck/test_preflight.py::test_a_torchrun_command_is_checked_with_its_whole_rank_set": "test_a_program_that_fails_within_the_preflight_steps_is_reported_bisected_and_kept",
    # upstream classes (tests/realistic/test_upstream_classes.py): gat's bisect and hogwild's
    # refusal stay; the rest repeat a claim a unit test pins in the default tier (a sparse leaf
    # comes back sparse, ulps of a float32, the samples' dim, a NaN batch is data, a model with
    # no parameters is healthy) or gat's bisect (gcn's)
    "tests/realistic/test_upstream_classes.py::test_a_sparse_graph_handed_to_the_step_as_its_batch_replays_bitwise": "tests/unit/test_tree_roundtrip.py",
    "tests/realistic/test_upstream_classes.py::test_a_full_batch_graph_run_whose_lr_explodes_is_bisected_to_the_overflowing_op[gcn": "[gat",
    "tests/realistic/test_upstream_classes.py::test_a_layer_local_run_whose_network_holds_no_parameters_is_healthy_not_non_finite": "tests/unit/test_health_flags_overflow.py",
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
