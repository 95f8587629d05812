"""Systems that mix device types: pipeline stages on device groups, each stage with its own
tp, dp and layer count, the question Metis (SamsungLabs/Metis) answers; see
:mod:`simcore.mixed.estimate` for the cost model and what it leaves out."""

from simcore.mixed.estimate import check_mixed, estimate_mixed, stage_system
from simcore.mixed.profile import LayerProfiles, ProfiledLayer
from simcore.mixed.specs import MixedPlan, MixedStage, MixedSystemSpec

__all__ = ["LayerProfiles", "MixedPlan", "MixedStage", "MixedSystemSpec", "ProfiledLayer",
           "check_mixed", "estimate_mixed", "stage_system"]
