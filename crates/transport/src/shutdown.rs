//! A one-shot, cloneable stop signal for a process's tasks (the agents', the
//! proxy's): triggered once, awaited by any number of tasks.

use tokio::sync::watch;

#[derive(Clone, Debug)]
pub struct Shutdown(watch::Sender<bool>);

impl Default for Shutdown {
    fn default() -> Self {
        Shutdown::new()
    }
}

impl Shutdown {
    pub fn new() -> Shutdown {
        Shutdown(watch::channel(false).0)
    }

    pub fn trigger(&self) {
        self.0.send_replace(true);
    }

    pub fn is_triggered(&self) -> bool {
        *self.0.borrow()
    }

    /// Returns once [`Shutdown::trigger`] has been called (at once if it was).
    pub async fn wait(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|stop| *stop).await;
    }
}
