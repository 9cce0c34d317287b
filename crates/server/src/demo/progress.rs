//! The demo's progress: a bar on a terminal, plain lines otherwise (a pipe, a file, a CI
//! log), where a redrawn bar would be a screenful of escape codes.

use std::io::IsTerminal;
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::Notify;

use super::count;

/// How often a plain-lines progress says where it is: often enough that a log shows the
/// run moving, rarely enough that a 30-second phase is a handful of lines.
const PLAIN_EVERY: Duration = Duration::from_secs(5);
/// How often a bar redraws: smooth to the eye, a negligible cost beside the load.
const BAR_REFRESH_HZ: u8 = 10;

/// How the demo shows what it is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Display {
    /// stdout is a terminal: bars.
    Bars,
    /// Anything else: a line now and then.
    Lines,
}

impl Display {
    pub fn detect() -> Self {
        if std::io::stdout().is_terminal() {
            Self::Bars
        } else {
            Self::Lines
        }
    }
}

/// One phase's progress: `position` of `length`, with a message of the counts so far.
pub struct Progress {
    bar: ProgressBar,
    /// Plain lines: wakes the printer to print its last line and stop.
    done: Option<(Arc<Notify>, tokio::task::JoinHandle<()>)>,
}

impl Progress {
    /// Starts showing a phase named `label` (a short word, padded into a column) of
    /// `length` steps counted in `unit`.
    pub fn start(display: Display, label: &str, length: u64, unit: &str) -> Self {
        match display {
            Display::Bars => {
                let bar = ProgressBar::with_draw_target(
                    Some(length),
                    ProgressDrawTarget::stdout_with_hz(BAR_REFRESH_HZ),
                );
                // No colours when NO_COLOR is set to anything (no-color.org), as for logs.
                let bar_style = match std::env::var_os("NO_COLOR") {
                    Some(v) if !v.is_empty() => "{bar:30}",
                    _ => "{bar:30.cyan/blue}",
                };
                let template = format!(
                    "{{prefix:<9}} [{bar_style}] {{human_pos}}/{{human_len}} {unit} {{elapsed:>4}}  {{msg}}"
                );
                bar.set_style(
                    ProgressStyle::with_template(&template)
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                );
                bar.set_prefix(label.to_owned());
                bar.enable_steady_tick(Duration::from_millis(1000 / u64::from(BAR_REFRESH_HZ)));
                Self { bar, done: None }
            }
            Display::Lines => {
                let bar = ProgressBar::hidden();
                bar.set_length(length);
                bar.set_prefix(label.to_owned());
                let notify = Arc::new(Notify::new());
                let printer =
                    tokio::spawn(print_lines(bar.clone(), unit.to_owned(), notify.clone()));
                Self {
                    bar,
                    done: Some((notify, printer)),
                }
            }
        }
    }

    pub fn inc(&self, n: u64) {
        self.bar.inc(n);
    }

    pub fn set_position(&self, n: u64) {
        self.bar.set_position(n);
    }

    pub fn set_message(&self, message: String) {
        self.bar.set_message(message);
    }

    /// Ends the phase: the bar stays on screen as its last state; plain lines print
    /// their last.
    pub async fn finish(self) {
        match self.done {
            None => self.bar.finish(),
            Some((notify, printer)) => {
                notify.notify_one();
                let _ = printer.await;
            }
        }
    }
}

fn line(bar: &ProgressBar, unit: &str) -> String {
    let message = bar.message();
    let sep = if message.is_empty() { "" } else { "  " };
    format!(
        "{:<9} {}/{} {unit}{sep}{message}",
        bar.prefix(),
        count(bar.position()),
        count(bar.length().unwrap_or(0))
    )
}

async fn print_lines(bar: ProgressBar, unit: String, done: Arc<Notify>) {
    loop {
        tokio::select! {
            () = done.notified() => {
                println!("{}", line(&bar, &unit));
                return;
            }
            () = tokio::time::sleep(PLAIN_EVERY) => println!("{}", line(&bar, &unit)),
        }
    }
}
