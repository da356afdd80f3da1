"""The chess layer: P:/A: formats, Stockfish, rewards, data, evaluation, and chess on the core's trainers."""
