//! Discovery: where a node finds the others. `etcd_config` says where etcd is and how a node
//! registers there, `etcd` keeps the registration and watches the others', and `directory`
//! holds what it learned for routing to read.

pub(crate) mod directory;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod etcd_config;
