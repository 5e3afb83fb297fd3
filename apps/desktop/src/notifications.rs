//! Approval requests as desktop notifications with buttons, through the
//! desktop's notification server (`org.freedesktop.Notifications` on the
//! session bus, the Desktop Notifications Specification): a call waiting for
//! an answer is shown with Approve / Deny / Always for this session, the
//! button pressed (`ActionInvoked`) answers it, and a request settled
//! anywhere closes its notification.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use tokio::sync::OnceCell;

use crate::controller::{Controller, Shell};
use crate::state::WaitingApproval;

const NAME: &str = "org.freedesktop.Notifications";
const PATH: &str = "/org/freedesktop/Notifications";

/// The buttons: `(action key, label)`; the key is the decision sent.
const BUTTONS: [(&str, &str); 3] =
    [("approve", "Approve"), ("deny", "Deny"), ("always", "Always for this session")];

/// The notifications shown for waiting calls.
#[derive(Debug, Default)]
pub struct Notifier {
    bus: OnceCell<zbus::Connection>,
    /// Request id → the server's notification id.
    shown: Mutex<HashMap<String, u32>>,
}

impl Notifier {
    async fn bus(&self) -> anyhow::Result<&zbus::Connection> {
        Ok(self.bus.get_or_try_init(zbus::Connection::session).await?)
    }

    fn shown(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.shown.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Shows `approval` with its buttons.
    ///
    /// # Errors
    /// No session bus, or no notification server on it.
    pub async fn ask(&self, approval: &WaitingApproval) -> anyhow::Result<()> {
        if self.shown().contains_key(&approval.id) {
            return Ok(());
        }
        let actions: Vec<&str> = BUTTONS.iter().flat_map(|(key, label)| [*key, *label]).collect();
        let hints: HashMap<&str, zbus::zvariant::Value<'_>> = HashMap::new();
        let body = format!("{}\nin {}", approval.call(), approval.session_key);
        let reply = self
            .bus()
            .await?
            .call_method(
                Some(NAME),
                PATH,
                Some(NAME),
                "Notify",
                // Never expires by itself: the request has its own expiry,
                // and its settling closes the notification.
                &("Lemon Gateway", 0u32, "", "Allow this?", body.as_str(), actions, hints, 0i32),
            )
            .await?;
        let id: u32 = reply.body().deserialize()?;
        self.shown().insert(approval.id.clone(), id);
        Ok(())
    }

    /// Closes the notification of request `id`, if one is shown.
    pub async fn withdraw(&self, id: &str) {
        let Some(shown) = self.shown().remove(id) else { return };
        let Ok(bus) = self.bus().await else { return };
        if let Err(error) =
            bus.call_method(Some(NAME), PATH, Some(NAME), "CloseNotification", &shown).await
        {
            tracing::debug!(%error, "a notification could not be closed");
        }
    }

    /// Answers each pressed button until the bus goes away.
    pub async fn listen(self: Arc<Self>, controller: Controller, shell: Arc<dyn Shell>) {
        if let Err(error) = self.listen_inner(&controller, &shell).await {
            tracing::info!(%error, "no notification buttons: approvals are answered from the tray and the dashboard");
        }
    }

    async fn listen_inner(
        &self,
        controller: &Controller,
        shell: &Arc<dyn Shell>,
    ) -> anyhow::Result<()> {
        let bus = self.bus().await?;
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(NAME)?
            .member("ActionInvoked")?
            .build();
        let mut signals = zbus::MessageStream::for_match_rule(rule, bus, Some(16)).await?;
        tracing::debug!("listening for notification buttons");
        while let Some(message) = signals.next().await {
            let Ok((shown, key)) = message?.body().deserialize::<(u32, String)>() else { continue };
            let Some(decision) = BUTTONS.iter().map(|(k, _)| *k).find(|k| *k == key) else {
                continue;
            };
            let request = self.shown().iter().find(|(_, id)| **id == shown).map(|(r, _)| r.clone());
            let Some(request) = request else { continue };
            tracing::info!(approval = %request, decision, "notification button pressed");
            if let Err(error) = controller.answer(&request, decision, &**shell).await {
                shell.notify("Lemon Gateway", &format!("{error:#}"));
            }
        }
        Ok(())
    }
}
