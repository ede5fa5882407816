//! The server's connection to its application module, made again after the
//! module closed it (it stopped, or crashed and was started again by
//! `cluster up`'s supervisor or systemd).
//!
//! A grant belongs to the connection that gave it: a request keeps the
//! client it was granted on ([`Granted`]) for its READ_DONE or UPDATE_DONE,
//! and only a request asking for a new grant after the close uses a new
//! connection. A restarted module has a new version table (a new
//! incarnation), so nothing a proxy cached from the old one validates:
//! reconnecting serves nothing stale. While the module is down, requests
//! fail at once (503) and each one tries the socket again.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tierstack_coherent::module::{Access, ClientOptions, ModuleClient, ModuleError};

/// A grant and the connection it was given on.
pub(crate) struct Granted {
    pub(crate) access: Access,
    pub(crate) client: Arc<ModuleClient>,
}

pub(crate) struct ModuleLink {
    current: Mutex<Arc<ModuleClient>>,
    /// One reconnection at a time; the others then use its connection.
    reconnecting: tokio::sync::Mutex<()>,
    socket: PathBuf,
    options: ClientOptions,
    reconnects: AtomicU64,
}

impl ModuleLink {
    pub(crate) fn new(client: ModuleClient, socket: PathBuf, options: ClientOptions) -> ModuleLink {
        ModuleLink {
            current: Mutex::new(Arc::new(client)),
            reconnecting: tokio::sync::Mutex::new(()),
            socket,
            options,
            reconnects: AtomicU64::new(0),
        }
    }

    fn client(&self) -> Arc<ModuleClient> {
        tierstack_base::sync::lock(&self.current).clone()
    }

    /// Times a closed connection was replaced by a new one.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// READ_REQUEST for `keys` (connecting again once if the module had closed the connection).
    pub(crate) async fn read(&self, keys: &[String]) -> Result<Granted, ModuleError> {
        self.grant(|client| async move { client.read(keys).await }).await
    }

    /// UPDATE_REQUEST for `keys`, as [`ModuleLink::read`].
    pub(crate) async fn update(&self, keys: &[String]) -> Result<Granted, ModuleError> {
        self.grant(|client| async move { client.update(keys).await }).await
    }

    async fn grant<F, Fut>(&self, ask: F) -> Result<Granted, ModuleError>
    where
        F: Fn(Arc<ModuleClient>) -> Fut,
        Fut: std::future::Future<Output = Result<Access, ModuleError>>,
    {
        let client = self.client();
        match ask(client.clone()).await {
            Ok(access) => Ok(Granted { access, client }),
            Err(ModuleError::Closed) => {
                let fresh = self.reconnect(&client).await?;
                let access = ask(fresh.clone()).await?;
                Ok(Granted { access, client: fresh })
            }
            Err(e) => Err(e),
        }
    }

    /// Replaces `stale` (closed) by a new connection, unless another
    /// request already did.
    async fn reconnect(&self, stale: &Arc<ModuleClient>) -> Result<Arc<ModuleClient>, ModuleError> {
        let _one = self.reconnecting.lock().await;
        let current = self.client();
        if !Arc::ptr_eq(&current, stale) {
            return Ok(current);
        }
        let fresh = Arc::new(ModuleClient::connect_with(&self.socket, &self.options).await?);
        *tierstack_base::sync::lock(&self.current) = fresh.clone();
        self.reconnects.fetch_add(1, Ordering::Relaxed);
        tracing::info!(socket = %self.socket.display(), "connected to the application module again");
        Ok(fresh)
    }
}
