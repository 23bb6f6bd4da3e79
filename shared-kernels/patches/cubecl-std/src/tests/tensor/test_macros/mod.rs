mod identity;
mod into_contiguous;
