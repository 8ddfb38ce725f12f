"""The sampler family: what proposes the next config.

``samplers`` builds a study's sampler from its pinned and stored arguments; ``auto`` is TPE
planned for the number of trials at once; ``spacefill`` its space-filling start; ``distinct``
its TPE that passes over repeated values; ``history`` TPE on a bounded history.
"""
