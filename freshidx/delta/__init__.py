"""The delta index: micro-batch builds that append segments, their merge, compaction."""
