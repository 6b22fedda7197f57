//! The answer's body as the send's machine reads it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokenwarden_core::Answer;
use tokio::time::{Instant, Sleep};

use crate::call::Meter;

/// A boxed error, what every body and service of this crate fails with.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of an answer through tokenwarden: a governed success's body read as it passes
/// (its usage read, the lease renewed while it streams and settled when it ends, an idle
/// timeout ending it with `upstream_timeout`), or an answer tokenwarden made or passed as it
/// is.
pub struct MeteredBody<B> {
    kind: Kind<B>,
}

enum Kind<B> {
    /// Passed as it is.
    Pass(Pin<Box<B>>),
    /// tokenwarden's own answer.
    Full(Option<Bytes>),
    /// Read by the send's machine.
    Metered(Box<Metering<B>>),
}

struct Metering<B> {
    /// The upstream body; dropped (the request aborted) once it ends or fails.
    inner: Option<Pin<Box<B>>>,
    meter: Meter,
    /// Frames read before the answer was handed over (a JSON answer is held until it ends).
    held: VecDeque<Frame<Bytes>>,
    sleep: Pin<Box<Sleep>>,
    /// The machine knows the caller waits for a piece.
    reading: bool,
}

impl<B> std::fmt::Debug for MeteredBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.kind {
            Kind::Pass(_) => "pass",
            Kind::Full(_) => "full",
            Kind::Metered(_) => "metered",
        };
        f.debug_struct("MeteredBody").field("kind", &kind).finish()
    }
}

/// What the core makes of a success's head: an event stream, an empty body, or JSON.
pub(crate) fn answer_kind(headers: &http::HeaderMap, empty: bool) -> Answer {
    let stream = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
    if stream {
        Answer::Stream
    } else if empty {
        Answer::Empty
    } else {
        Answer::Json
    }
}

impl<B> MeteredBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    /// A body passed as it is.
    pub(crate) fn pass(inner: B) -> MeteredBody<B> {
        MeteredBody {
            kind: Kind::Pass(Box::pin(inner)),
        }
    }

    /// tokenwarden's own answer.
    pub(crate) fn full(bytes: Bytes) -> MeteredBody<B> {
        MeteredBody {
            kind: Kind::Full(Some(bytes)),
        }
    }

    /// A governed success's body: the meter is told the answer (`answer`), then reads it.
    pub(crate) fn metered(inner: B, mut meter: Meter, answer: Answer) -> MeteredBody<B> {
        meter.answer(answer);
        MeteredBody {
            kind: Kind::Metered(Box::new(Metering {
                inner: Some(Box::pin(inner)),
                meter,
                held: VecDeque::new(),
                sleep: Box::pin(tokio::time::sleep_until(Instant::now())),
                reading: false,
            })),
        }
    }

    /// Reads until the machine says to hand the answer over (a stream at once, a JSON
    /// answer when it ended): what the caller gets is then settled. Fails as the body
    /// would (a broken body, an idle timeout).
    pub(crate) async fn hold(&mut self) -> Result<(), BoxError> {
        let Kind::Metered(m) = &mut self.kind else {
            return Ok(());
        };
        while !m.meter.delivered && m.inner.is_some() {
            match std::future::poll_fn(|cx| m.poll_raw(cx)).await {
                Some(Ok(frame)) => m.held.push_back(frame),
                Some(Err(e)) => return Err(e),
                None => break,
            }
        }
        Ok(())
    }
}

impl<B> Metering<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    fn poll_raw(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        if !self.reading {
            self.reading = true;
            self.meter.reading();
        }
        // A timer that fires moves the deadline; a few turns settle it.
        for _ in 0..4 {
            if let Some(e) = self.meter.timed_out.take() {
                self.inner = None;
                return Poll::Ready(Some(Err(Box::new(e))));
            }
            let Some(at) = self.meter.deadline() else {
                break;
            };
            if self.sleep.deadline() != at {
                self.sleep.as_mut().reset(at);
            }
            if self.sleep.as_mut().poll(cx).is_pending() {
                break;
            }
            self.meter.timeout();
        }
        match inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.reading = false;
                    self.meter.push(data);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                self.inner = None;
                self.meter.broken();
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(None) => {
                self.inner = None;
                self.meter.end();
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<B> Body for MeteredBody<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match &mut self.get_mut().kind {
            Kind::Pass(inner) => inner.as_mut().poll_frame(cx).map_err(Into::into),
            Kind::Full(bytes) => Poll::Ready(bytes.take().map(|b| Ok(Frame::data(b)))),
            Kind::Metered(m) => match m.held.pop_front() {
                Some(frame) => Poll::Ready(Some(Ok(frame))),
                None => m.poll_raw(cx),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Pass(inner) => inner.is_end_stream(),
            Kind::Full(bytes) => bytes.is_none(),
            Kind::Metered(m) => m.held.is_empty() && m.inner.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Pass(inner) => inner.size_hint(),
            Kind::Full(bytes) => SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64)),
            Kind::Metered(m) if m.inner.is_none() => {
                let held = m
                    .held
                    .iter()
                    .filter_map(Frame::data_ref)
                    .map(Bytes::len)
                    .sum::<usize>();
                SizeHint::with_exact(held as u64)
            }
            Kind::Metered(_) => SizeHint::default(),
        }
    }
}
