//! A `Stream` paced by a limiter (cargo feature `stream`).

use core::future::Future;
use core::pin::Pin;
use core::task::{Context, Poll};
use std::sync::Arc;

use futures_core::Stream;
use pin_project_lite::pin_project;

use crate::cell::TatWord;
use crate::clock::Clock;
use crate::gcra::Params;
use crate::limiter::Limiter;
use crate::wait::future::{Acquire, Target};
use crate::wait::queue::Waiters;

/// The limiter a throttled stream keeps: made from a `&Limiter` or, for a `'static`
/// stream, an `Arc<Limiter>` (`throttle` takes either).
///
/// # Examples
///
/// ```
/// use paceline::{stream::Handle, Limiter, Quota};
/// use std::sync::Arc;
///
/// let limiter = Arc::new(Limiter::new(Quota::per_second(10)));
/// let owned: Handle<'static, _> = Arc::clone(&limiter).into();
/// let borrowed: Handle<'_, _> = (&*limiter).into();
/// # drop((owned, borrowed));
/// ```
#[derive(Debug)]
pub struct Handle<'a, C: Clock> {
    limiter: Shared<'a, C>,
}

#[derive(Debug)]
enum Shared<'a, C: Clock> {
    Borrowed(&'a Limiter<C>),
    Owned(Arc<Limiter<C>>),
}

impl<C: Clock> Clone for Handle<'_, C> {
    fn clone(&self) -> Self {
        Handle {
            limiter: match &self.limiter {
                Shared::Borrowed(l) => Shared::Borrowed(l),
                Shared::Owned(l) => Shared::Owned(Arc::clone(l)),
            },
        }
    }
}

impl<'a, C: Clock> From<&'a Limiter<C>> for Handle<'a, C> {
    fn from(limiter: &'a Limiter<C>) -> Self {
        Handle {
            limiter: Shared::Borrowed(limiter),
        }
    }
}

impl<C: Clock> From<Arc<Limiter<C>>> for Handle<'static, C> {
    fn from(limiter: Arc<Limiter<C>>) -> Self {
        Handle {
            limiter: Shared::Owned(limiter),
        }
    }
}

impl<C: Clock> Handle<'_, C> {
    fn get(&self) -> &Limiter<C> {
        match &self.limiter {
            Shared::Borrowed(l) => l,
            Shared::Owned(l) => l,
        }
    }
}

impl<C: Clock> Target for Handle<'_, C> {
    type Clock = C;

    fn params(&self) -> Params {
        Target::params(&self.get())
    }

    fn clock(&self) -> &C {
        Target::clock(self.get())
    }

    fn waiters(&self) -> Arc<Waiters<C>> {
        Target::waiters(&self.get())
    }

    fn with_word<R>(&self, f: impl FnOnce(&TatWord, crate::cell::Ours<'_>) -> R) -> Result<R, u64> {
        Target::with_word(&self.get(), f)
    }

    fn with_stored_word<R>(&self, f: impl FnOnce(&TatWord, u64) -> R) -> Option<R> {
        Target::with_stored_word(&self.get(), f)
    }
}

pin_project! {
    /// A stream whose items come no faster than a limiter allows: see [`throttle`].
    ///
    /// # Examples
    ///
    /// ```
    /// use futures::StreamExt;
    /// use paceline::{stream::{throttle, Throttled}, Limiter, Quota};
    ///
    /// let limiter = Limiter::new(Quota::per_second(100));
    /// // It holds a booked place while an item waits, so it is pinned to be polled.
    /// let paced: Throttled<'_, _, _> = throttle(futures::stream::iter(["a", "b"]), &limiter);
    /// let mut paced = Box::pin(paced);
    /// assert_eq!(futures::executor::block_on(paced.next()), Some("a"));
    /// ```
    #[must_use = "streams do nothing unless polled"]
    pub struct Throttled<'a, S: Stream, C: Clock> {
        #[pin]
        stream: S,
        // The booked turn of `item`, while it waits.
        #[pin]
        turn: Option<Acquire<Handle<'a, C>>>,
        item: Option<S::Item>,
        limiter: Handle<'a, C>,
        // Set once an item's booking was refused: the stream has ended.
        refused: bool,
    }
}

/// Yields `stream`'s items no faster than `limiter` allows, one cell per item.
///
/// Each item is taken from `stream` first, then waits its booked turn on the limiter
/// (the same FIFO as every other waiter of that limiter), then is yielded. So several
/// throttled streams sharing one limiter are served in the order their items arrived,
/// and a stream that is slower than the limit is never delayed by it. Dropping the
/// throttled stream while an item waits gives that item's cell back.
///
/// `limiter` is a `&Limiter`, or an `Arc<Limiter>` for a stream that must be `'static`
/// (to spawn it, say).
///
/// The stream ends early only if an item's booking is refused, which happens only at the
/// end of representable time (584 years after the clock's origin, or a clock that
/// jumps there): no item is ever yielded without its cell.
///
/// # Examples
///
/// ```
/// use futures::StreamExt;
/// use paceline::{stream::throttle, Limiter, Quota};
///
/// let limiter = Limiter::new(Quota::per_second(1000).with_burst(1));
/// let start = std::time::Instant::now();
/// let items: Vec<u32> = futures::executor::block_on(
///     throttle(futures::stream::iter(0..5), &limiter).collect(),
/// );
/// assert_eq!(items, [0, 1, 2, 3, 4]);
/// assert!(start.elapsed().as_millis() >= 4); // one at once, then one per millisecond
/// ```
pub fn throttle<'a, S: Stream, C: Clock>(
    stream: S,
    limiter: impl Into<Handle<'a, C>>,
) -> Throttled<'a, S, C> {
    Throttled {
        stream,
        turn: None,
        item: None,
        limiter: limiter.into(),
        refused: false,
    }
}

impl<S: Stream, C: Clock> core::fmt::Debug for Throttled<'_, S, C> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Throttled")
            .field("waiting", &self.item.is_some())
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

impl<S: Stream, C: Clock> Stream for Throttled<'_, S, C> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let mut this = self.project();
        if *this.refused {
            return Poll::Ready(None);
        }
        if this.item.is_none() {
            match this.stream.poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(item)) => {
                    *this.item = Some(item);
                    this.turn
                        .set(Some(Acquire::new(this.limiter.clone(), 1, u64::MAX)));
                }
            }
        }
        if let Some(turn) = this.turn.as_mut().as_pin_mut() {
            match turn.poll(cx) {
                // A finished turn is dropped at once: it is never polled again.
                Poll::Ready(Ok(())) => this.turn.set(None),
                Poll::Ready(Err(_)) => {
                    // One cell always fits the burst; only a booking past the end of
                    // representable time is refused. The item goes without its cell,
                    // and the stream ends.
                    this.turn.set(None);
                    *this.item = None;
                    *this.refused = true;
                    return Poll::Ready(None);
                }
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(this.item.take())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.refused {
            return (0, Some(0));
        }
        let (low, high) = self.stream.size_hint();
        let waiting = usize::from(self.item.is_some());
        (
            low.saturating_add(waiting),
            high.and_then(|h| h.checked_add(waiting)),
        )
    }
}
