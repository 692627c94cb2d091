"""Prompt data: sources and columns (``prompts``) and the seeded, resumable samplers."""
from .prompts import PromptDataModule, PromptDataset, ResumableLoader, collate_prompts, load_rows
from .samplers import EpochSampler, WeightedEpochSampler

__all__ = ["EpochSampler", "PromptDataModule", "PromptDataset", "ResumableLoader", "WeightedEpochSampler",
           "collate_prompts", "load_rows"]
