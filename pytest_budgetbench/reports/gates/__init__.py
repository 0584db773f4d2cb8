"""Gates, in one home: what a gate is and its rules (:mod:`.verdicts`, a leaf every layer may
read), judging a computed report (:mod:`.judging`, for the plugin's gate items and the console
command alike), and a gate item's run during a sweep (:mod:`.items`)."""
