"""The broker's side of the controller link: channel, lifecycle, metadata follower."""
