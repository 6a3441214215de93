"""Whole config groups of ``llmlab train``, each declared as one package here.

A package ``<group>/`` is the whole group. Its ``__init__`` declares the group's `Registry`
(``group=`` the package's name, ``default=`` the option a run gets when it names none,
``watches=True`` when its parts only watch a run and leave what it computes alone), then
finds its kinds with ``discover(__name__, __path__)``; each kind is one file, its class with
a nested ``Config``. Nothing else is edited: ``llmlab train`` composes the group
(``<group>=<option>``, ``<group>.<setting>=...``, sweeps over either), checks its section
before any work, lists it in ``--help``, keeps a watching group out of the run id, and
builds its part beside the run's others as ``cls(cfg, model, data)``: the checked Config,
the model, and the run's `llmlab.train.parts.RunData`.

What the training loop asks of such a part:

- ``measure(step)``, at every log step: a mapping of names to numbers, logged with that
  step as ``<group>/<name>`` (metrics.jsonl and the logger); its time is not counted as
  training time.
- ``state_dict()`` and ``load_state_dict(state)``, where it has them: saved in every
  checkpoint (trainer.pt, under the group's name) and restored on resume.

A group's modules import no torch at their top (a kind imports it where it runs), so that
composing and checking a config stays quick.
"""
