"""The auto-tuner (tasks, space, cost model, search, measure, database, scheduler).

Not built yet: it is the subject of a later issue. Until then compiler/lower applies the
target's default schedules to every kernel."""
