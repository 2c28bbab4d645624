"""PageAllocator: reference counts, the content-keyed cache of pages, LRU eviction."""

from __future__ import annotations

import pytest

from specdec.kernels.page_allocator import OutOfPagesError, PageAllocator


def test_a_shared_page_is_freed_only_when_its_last_holder_lets_go():
    alloc = PageAllocator(2)
    (page,) = alloc.allocate(1)
    alloc.share([page])
    assert alloc.refcount(page) == 2
    alloc.free([page])
    assert alloc.refcount(page) == 1 and alloc.num_free == 1
    alloc.free([page])
    assert alloc.refcount(page) == 0 and alloc.num_free == 2
    with pytest.raises(ValueError, match="double free"):
        alloc.free([page])


def test_freeing_a_page_more_times_than_it_is_held_changes_nothing():
    alloc = PageAllocator(3)
    a, b = alloc.allocate(2)
    with pytest.raises(ValueError, match="double free"):
        alloc.free([b, a, a])
    assert alloc.refcount(a) == alloc.refcount(b) == 1 and alloc.num_free == 1


def test_a_published_page_stays_findable_after_release_and_counts_as_free():
    alloc = PageAllocator(2)
    (page,) = alloc.allocate(1)
    alloc.publish(page, "k")
    alloc.free([page])
    assert alloc.num_free == 2 and alloc.num_cached == 1
    assert alloc.lookup("k") == page
    alloc.share([page])  # found again: held, no longer evictable
    assert alloc.refcount(page) == 1 and alloc.num_free == 1


def test_allocate_takes_free_pages_before_evicting_cached_ones():
    alloc = PageAllocator(3)
    cached = alloc.allocate(2)
    alloc.publish(cached[0], "x")
    alloc.publish(cached[1], "y")
    alloc.free(cached)
    (fresh,) = alloc.allocate(1)
    assert fresh not in cached and alloc.num_cached == 2


def test_eviction_takes_the_least_recently_released_page_and_forgets_its_key():
    alloc = PageAllocator(3)
    pages = alloc.allocate(3)
    for page, key in zip(pages, "abc", strict=True):
        alloc.publish(page, key)
    for page in (pages[1], pages[0], pages[2]):  # released in the order b, a, c
        alloc.free([page])
    (evicted,) = alloc.allocate(1)
    assert evicted == pages[1] and alloc.lookup("b") is None
    assert alloc.lookup("a") == pages[0] and alloc.lookup("c") == pages[2]
    assert alloc.refcount(evicted) == 1 and alloc.num_cached == 2


def test_a_cached_page_found_again_is_used_more_recently():
    alloc = PageAllocator(2)
    pages = alloc.allocate(2)
    alloc.publish(pages[0], "a")
    alloc.publish(pages[1], "b")
    alloc.free(pages)
    alloc.share([alloc.lookup("a")])
    alloc.free([pages[0]])  # "a" is now the most recently released
    (evicted,) = alloc.allocate(1)
    assert evicted == pages[1] and alloc.lookup("a") == pages[0]


def test_held_pages_are_never_evicted():
    alloc = PageAllocator(2)
    held = alloc.allocate(2)
    alloc.publish(held[0], "a")
    with pytest.raises(OutOfPagesError):
        alloc.allocate(1)
    assert alloc.lookup("a") == held[0] and alloc.refcount(held[0]) == 1


def test_allocation_is_all_or_nothing_over_free_and_cached_pages():
    alloc = PageAllocator(3)
    page = alloc.allocate(2)[0]
    alloc.publish(page, "a")
    alloc.free([page])
    with pytest.raises(OutOfPagesError) as err:
        alloc.allocate(3)
    assert err.value.num_free == 2
    assert alloc.lookup("a") == page and alloc.num_free == 2


def test_publish_keeps_the_first_page_of_a_key_and_needs_a_held_page():
    alloc = PageAllocator(3)
    a, b = alloc.allocate(2)
    alloc.publish(a, "k")
    alloc.publish(b, "k")  # the content is cached already: no-op
    assert alloc.lookup("k") == a
    with pytest.raises(ValueError, match="another key"):
        alloc.publish(a, "other")
    alloc.free([b])
    with pytest.raises(ValueError, match="not held"):
        alloc.publish(b, "j")


def test_unpublish_forgets_the_key_and_frees_an_evictable_page():
    alloc = PageAllocator(2)
    a, b = alloc.allocate(2)
    alloc.publish(a, "a")
    alloc.publish(b, "b")
    alloc.unpublish(a)
    assert alloc.lookup("a") is None and alloc.refcount(a) == 1
    alloc.free([b])
    alloc.unpublish(b)
    assert alloc.lookup("b") is None and alloc.num_cached == 0 and alloc.num_free == 1
    alloc.unpublish(b)  # no key: no-op


def test_share_refuses_a_page_neither_held_nor_cached_and_changes_nothing():
    alloc = PageAllocator(2)
    (page,) = alloc.allocate(1)
    with pytest.raises(ValueError, match="neither held nor cached"):
        alloc.share([page, 1])
    assert alloc.refcount(page) == 1
