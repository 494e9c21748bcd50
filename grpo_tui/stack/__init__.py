"""The GRPO stack run over the generic supervisor (``grpo_tui.supervisor``).

The supervisor knows processes, not what they are for; this package knows the GRPO roles
and what a run of them may be asked to do, through the supervisor's public API only:
``stack.py`` (:class:`GrpoStack`, one run: a supervisor and the plan's callbacks),
``modes.py`` (the training-mode switch), ``edits.py`` (live hyperparameter edits) and
``requests.py`` (the control-socket actions the stack adds to the supervisor's). Policies
about the GRPO roles (what a stalled or failed role means for the others, how inference
lives through a mode switch) belong here too, a module per idea.
"""
