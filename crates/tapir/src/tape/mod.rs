//! Layer 2, the record: ids, the op table and the tape. It knows `Op`, not what runs it.

pub(crate) mod id;
pub(crate) mod in_place;
pub(crate) mod op;
pub(crate) mod profile;
#[allow(clippy::module_inception)] // the tape layer's central type, in a file of its own
pub(crate) mod tape;
