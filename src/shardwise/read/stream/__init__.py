"""Stream placement: R* streams over chunks, each rank reading only its streams' chunks, with a
bounded chunk cache and a read-ahead schedule."""
