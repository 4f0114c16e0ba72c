//! Macros the crate's services share.

/// The accessors of a middleware's inner service (its field `inner`), as tower's own
/// middleware have them: `get_ref`, `get_mut`, `into_inner`. Expands inside an `impl` block
/// whose inner service type is `S`.
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// The inner service, taken out.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}
