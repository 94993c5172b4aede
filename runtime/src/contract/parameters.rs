//! Parameters: turning checkpoint tensors into backend-native weights and binding them to a model's slots.
//!
//! The life of one weight: a [`CheckpointLease`] (or a [`DerivedWeightRecipe`] over a [`CheckpointSource`]) is
//! *materialized* into a backend-native weight — converted, packed, uploaded — giving an in-flight
//! `Materialization` that keeps the lease alive until the work has completed; *finishing* it yields the
//! `MaterializedWeight` and releases the lease. A weight can be *shared* (another handle to the same storage,
//! nothing re-read or copied), *validated* against a `Parameter` slot, and *bound* to it.
//!
//! The rule that makes a model's binding atomic: [`ParameterBackend::bind`] must not fail after
//! [`ParameterBackend::validate_bind`] succeeded on the same arguments. Orchestration therefore materializes and
//! validates every destination first and binds (publishes) only when all of them passed, so a bad checkpoint
//! changes nothing.

pub use crate::checkpoint::{CheckpointLease, CheckpointSource, TensorInfo};
pub use crate::recipe::DerivedWeightRecipe;

/// A backend that materializes checkpoint weights and binds them to parameter slots.
pub trait ParameterBackend {
    /// One parameter slot of a loaded model (its name, expected type, and the weight bound to it).
    type Parameter: 'static;
    /// A backend-native weight ready to bind.
    type MaterializedWeight;
    /// What materialization needs to know (target dtype, packing, the device).
    type MaterializationContext: ?Sized;
    /// An in-flight materialization: retains its encoded sources until the work has exactly completed.
    type Materialization;
    /// Why loading failed.
    type ParameterError: std::error::Error + Send + Sync + 'static;

    /// Lowers one checkpoint tensor, format as stored, into a native weight.
    fn materialize(
        lease: CheckpointLease,
        context: &Self::MaterializationContext,
    ) -> Result<Self::Materialization, Self::ParameterError>;

    /// Validates `recipe` against `source`, then lowers it directly into a native weight.
    fn materialize_recipe(
        recipe: &DerivedWeightRecipe,
        source: &dyn CheckpointSource,
        context: &Self::MaterializationContext,
    ) -> Result<Self::Materialization, Self::ParameterError>;

    /// The native weight an in-flight materialization is producing (valid to use once it has finished, or for
    /// work ordered after it).
    fn materialized_weight(materialization: &Self::Materialization) -> &Self::MaterializedWeight;

    /// Waits for exactly this materialization and releases its source lease.
    fn finish_materialization(
        materialization: Self::Materialization,
    ) -> Result<Self::MaterializedWeight, Self::ParameterError>;

    /// Another handle to the same native storage, without re-reading or re-materializing anything.
    fn share_materialized_weight(
        weight: &Self::MaterializedWeight,
    ) -> Result<Self::MaterializedWeight, Self::ParameterError>;

    /// Checks that `weight` fits `parameter` (dtype, shape, storage) without binding it.
    fn validate_bind(
        parameter: &Self::Parameter,
        weight: &Self::MaterializedWeight,
    ) -> Result<(), Self::ParameterError>;

    /// Binds `weight` to `parameter`. Never fails after [`ParameterBackend::validate_bind`] succeeded on the same
    /// arguments.
    fn bind(parameter: &mut Self::Parameter, weight: Self::MaterializedWeight) -> Result<(), Self::ParameterError>;
}
