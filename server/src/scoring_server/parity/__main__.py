from scoring_server.parity.cli import main

if __name__ == "__main__":
    main()
