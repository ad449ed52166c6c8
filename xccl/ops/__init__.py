"""The op vocabulary: every operation xccl runs, described once.

The floor under every other layer but the errors: the :class:`Collective` names (``_vocab``), and for each op its
one :class:`~xccl.ops._specs.Spec` (``_specs``): its arguments and their roles, its validation (``_validate``, what
every rank can check alone), and every fact the layers above keep about it, from the c10d methods torch reaches
it by to the name torch's flight recorder gives it. Which frame of a call is the user's (``_warn``) lives here too:
validation warns at the user's line.
"""
